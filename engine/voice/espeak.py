"""eSpeak NG in a child process of its own: `python -m engine.voice.espeak MEMORY_BYTES`.

eSpeak NG 1.52 overflows stack buffers on some texts (`"a." * 200` in one call smashes
its stack; other lengths and voices segfault or die of SIGBUS: memory corrupted beyond
the canary), so it never runs in the engine's process. This child (espeakng-loader's
library and data, driven through the C API with ctypes) reads one JSON request a line
on stdin and answers a JSON line, then the samples it announced:

    {"voices": true}                          -> {"voices": [...], "rate": R}
    {"text": T, "voice": V, "speed": S}       -> {"bytes": N, "rate": R} + N bytes (int16)
                                              or {"error": "...", "param": "voice"}

eSpeak keeps one global state: the parent sends one request at a time
(engine/voice/speaker.py, which starts this child, restarts it when it dies and limits
its memory and time).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

RATE_WPM = 165    # eSpeak's words a minute at speed 1.0 (its default is 175: a little fast)
_SYNTH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                          ctypes.c_void_p)
_SYNCHRONOUS, _CHARS_UTF8, _RATE, _IPA = 2, 1, 1, 0x02


class _Voice(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("languages", ctypes.c_char_p),
                ("identifier", ctypes.c_char_p), ("gender", ctypes.c_ubyte),
                ("age", ctypes.c_ubyte), ("variant", ctypes.c_ubyte), ("xx1", ctypes.c_ubyte),
                ("score", ctypes.c_int), ("spare", ctypes.c_void_p)]


class ESpeak:
    """The library, started once; one synthesis at a time."""

    def __init__(self):
        import espeakng_loader

        self._pieces: list[bytes] = []
        self._callback = _SYNTH(self._collect)  # kept: the library holds its address
        self._voice: str | None = None  # the voice eSpeak has set
        lib = ctypes.CDLL(espeakng_loader.get_library_path())
        lib.espeak_ListVoices.restype = ctypes.POINTER(ctypes.POINTER(_Voice))
        lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                              ctypes.c_int]
        self.rate = lib.espeak_Initialize(_SYNCHRONOUS, 0,
                                          espeakng_loader.get_data_path().encode(), 0)
        if self.rate <= 0:
            raise RuntimeError("eSpeak NG did not start")
        lib.espeak_SetSynthCallback(self._callback)
        self._lib = lib

    def _collect(self, samples, count, _events) -> int:
        if count > 0:
            self._pieces.append(ctypes.string_at(samples, count * 2))
        return 0

    def voices(self) -> list[str]:
        """eSpeak's languages (a priority byte, then the language's code)."""
        listed = self._lib.espeak_ListVoices(None)
        own, i = [], 0
        while listed[i]:
            own.append(listed[i].contents.languages[1:].decode(errors="replace"))
            i += 1
        return sorted(set(own))

    def phonemes(self, clause: str, voice: str) -> str:
        """The clause's phonemes in IPA, as Piper's voices were trained on them (eSpeak
        reads a clause at a time: the rest of a text is read on the next call)."""
        lib = self._lib
        self._set(voice)
        data = ctypes.create_string_buffer(clause.encode("utf-8", "replace"))
        pointer, out = ctypes.c_void_p(ctypes.addressof(data)), []
        while pointer.value:
            found = lib.espeak_TextToPhonemes(ctypes.byref(pointer), _CHARS_UTF8, _IPA)
            if found:
                out.append(found.decode("utf-8", "replace"))
        return " ".join(p for p in out if p)

    def _set(self, voice: str) -> None:
        if voice != self._voice:  # (eSpeak reads a voice's files each time it is set)
            self._voice = None
            if self._lib.espeak_SetVoiceByName(voice.encode()) != 0 and \
                    self._lib.espeak_SetVoiceByProperties(ctypes.byref(_Voice(
                        languages=voice.split("+")[0].lower().encode()))) != 0:
                raise LookupError(voice)
            self._voice = voice

    def say(self, sentence: str, voice: str, speed: float) -> bytes:
        """The samples of one sentence; LookupError when eSpeak has no such voice."""
        lib = self._lib
        self._set(voice)
        lib.espeak_SetParameter(_RATE, max(80, min(450, int(RATE_WPM * speed))), 0)
        self._pieces = []
        data = sentence.encode("utf-8", "replace") + b"\0"  # (a lone surrogate: "?")
        lib.espeak_Synth(data, len(data), 0, 0, 0, _CHARS_UTF8, None, None)
        lib.espeak_Synchronize()
        return b"".join(self._pieces)


def serve(requests, out) -> None:
    """Answer each request line until stdin closes."""
    espeak = ESpeak()
    for line in requests:
        asked = json.loads(line)
        if asked.get("voices"):
            _send(out, {"voices": espeak.voices(), "rate": espeak.rate})
            continue
        try:
            samples = espeak.say(asked["text"], asked["voice"], float(asked["speed"]))
        except LookupError:
            _send(out, {"error": f"voice: eSpeak NG has no voice {asked['voice']!r}",
                        "param": "voice"})
            continue
        _send(out, {"bytes": len(samples), "rate": espeak.rate}, samples)


def _send(out, head: dict, body: bytes = b"") -> None:
    out.write(json.dumps(head).encode() + b"\n" + body)
    out.flush()


if __name__ == "__main__":
    try:
        import resource

        memory = int(sys.argv[1])
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    except ImportError:  # Windows: the parent's timeout still holds
        pass
    # the answers go to a copy of stdout; the library's own prints go to stderr
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, answers)
