"""eSpeak NG, as espeakng-loader bundles it (the library and its data), driven through its
C API with ctypes: text in, 16-bit mono samples out, one sentence at a time so the first
sound is ready after the first sentence. eSpeak keeps one global state: one synthesis at
a time.

OpenAI's voice names are mapped to eSpeak's voices and variants; any eSpeak voice name
(`en-gb`, `de`, `fr+f3`) is taken too."""

from __future__ import annotations

import ctypes
import re
import threading
from typing import Iterator

from ..errors import InvalidRequest

MODEL_ID = "espeak-ng"
MAX_INPUT = 4096  # characters, as OpenAI's API
RATE_WPM = 165    # eSpeak's words a minute at speed 1.0 (its default is 175: a little fast)
OPENAI_VOICES = {"alloy": "en-us", "ash": "en-us+m3", "ballad": "en+m2",
                 "coral": "en-us+f3", "echo": "en-us+m7", "fable": "en",
                 "nova": "en-us+f2", "onyx": "en-us+m1", "sage": "en-us+f4",
                 "shimmer": "en-us+f5", "verse": "en+m4"}
SENTENCE = re.compile(r"(?<=[.!?;:])\s+|\n+")
_SYNTH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                          ctypes.c_void_p)
_SYNCHRONOUS, _CHARS_UTF8, _RATE = 2, 1, 1


class _Voice(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("languages", ctypes.c_char_p),
                ("identifier", ctypes.c_char_p), ("gender", ctypes.c_ubyte),
                ("age", ctypes.c_ubyte), ("variant", ctypes.c_ubyte), ("xx1", ctypes.c_ubyte),
                ("score", ctypes.c_int), ("spare", ctypes.c_void_p)]


class Speaker:
    def __init__(self):
        self._lib = None
        self.rate = 22050
        self._lock = threading.Lock()
        self._pieces: list[bytes] = []
        self._voice: str | None = None  # the voice eSpeak has set
        self._callback = _SYNTH(self._collect)  # kept: the library holds its address

    def _collect(self, samples, count, _events) -> int:
        if count > 0:
            self._pieces.append(ctypes.string_at(samples, count * 2))
        return 0

    def _loaded(self):
        if self._lib is None:
            import espeakng_loader

            lib = ctypes.CDLL(espeakng_loader.get_library_path())
            lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_Voice))
            self.rate = lib.espeak_Initialize(_SYNCHRONOUS, 0,
                                              espeakng_loader.get_data_path().encode(), 0)
            if self.rate <= 0:
                raise RuntimeError("eSpeak NG did not start")
            lib.espeak_SetSynthCallback(self._callback)
            self._lib = lib
        return self._lib

    def voices(self) -> list[str]:
        """OpenAI's names, then eSpeak's own voices."""
        with self._lock:
            listed = self._loaded().espeak_ListVoices(None)
            own, i = [], 0
            while listed[i]:  # languages: a priority byte, then the language's code
                own.append(listed[i].contents.languages[1:].decode(errors="replace"))
                i += 1
        return list(OPENAI_VOICES) + sorted(set(own))

    def voice(self, name: str) -> str:
        """eSpeak's voice for a request's `voice`, checked."""
        if name in OPENAI_VOICES:
            return OPENAI_VOICES[name]
        if not re.fullmatch(r"[A-Za-z][\w-]{0,30}(\+[a-z]\d{1,2})?", name or ""):
            raise InvalidRequest(f"voice: {name!r} is not a voice", param="voice")
        return name

    def sentences(self, text: str, voice: str, speed: float = 1.0) -> Iterator[bytes]:
        """The speech of `text`, a sentence's samples (int16) at a time."""
        if not text.strip():
            raise InvalidRequest("input: nothing to say", param="input")
        if len(text) > MAX_INPUT:
            raise InvalidRequest(f"input: at most {MAX_INPUT} characters", param="input")
        if not 0.25 <= speed <= 4.0:
            raise InvalidRequest("speed: from 0.25 to 4.0", param="speed")
        espeak_voice = self.voice(voice)
        for sentence in (s for s in SENTENCE.split(text) if s.strip()):
            yield self._say(sentence, espeak_voice, speed)

    def _say(self, sentence: str, voice: str, speed: float) -> bytes:
        data = sentence.encode("utf-8", "replace") + b"\0"  # (a lone surrogate: "?")
        with self._lock:
            lib = self._loaded()
            if voice != self._voice:  # (eSpeak reads a voice's files each time it is set)
                self._voice = None
                if lib.espeak_SetVoiceByName(voice.encode()) != 0 and \
                        lib.espeak_SetVoiceByProperties(ctypes.byref(_Voice(
                            languages=voice.split("+")[0].lower().encode()))) != 0:
                    raise InvalidRequest(f"voice: eSpeak NG has no voice {voice!r}",
                                         param="voice")
                self._voice = voice
            lib.espeak_SetParameter(_RATE, max(80, min(450, int(RATE_WPM * speed))), 0)
            self._pieces = []
            lib.espeak_Synth(data, len(data), 0, 0, 0, _CHARS_UTF8, None, None)
            lib.espeak_Synchronize()
            return b"".join(self._pieces)
