"""The speech models as the engine holds them: each loaded on first use (the recogniser let
go again after ten idle minutes, its memory counted beside the chat models' meanwhile),
listed in /v1/models with `kind` "transcription" or "speech"."""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelNotFound, SpeechFailed
from . import speaker, transcriber
from .speaker import Speaker
from .transcriber import Transcriber

# the model ids OpenAI's clients send, answered by the models here
TRANSCRIPTION_ALIASES = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe")
SPEECH_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


class Voice:
    def __init__(self, folder: Path, threads: int):
        self.transcriber = Transcriber(folder, threads)
        self.speaker = Speaker()

    @property
    def bytes(self) -> int:
        """RAM the speech models hold now (eSpeak NG's few MiB are not counted)."""
        return self.transcriber.bytes

    def transcription_model(self, name: str | None) -> Transcriber:
        if name in (None, "", transcriber.MODEL_ID, *TRANSCRIPTION_ALIASES):
            return self.transcriber
        raise ModelNotFound(f"no speech recognition model is called {name!r} (this engine "
                            f"has {transcriber.MODEL_ID})", param="model")

    def speech_model(self, name: str | None) -> Speaker:
        if name in (None, "", speaker.MODEL_ID, *SPEECH_ALIASES):
            return self.speaker
        raise ModelNotFound(f"no speech model is called {name!r} (this engine has "
                            f"{speaker.MODEL_ID})", param="model")

    def models(self) -> list[dict]:
        """The speech models as /v1/models lists them; a synthesizer that cannot start
        is listed as not loaded, with why, and never fails the list."""
        base = {"object": "model", "created": 0, "owned_by": "homerack"}
        try:
            voices, problem = self.speaker.voices(), {}
        except SpeechFailed as exc:
            voices, problem = [], {"error": exc.message}
        return [{**base, "id": transcriber.MODEL_ID, "kind": "transcription",
                 "loaded": self.transcriber.loaded, "aliases": list(TRANSCRIPTION_ALIASES),
                 "capabilities": ["transcription", "translation"],
                 "size_bytes": transcriber.MODEL_BYTES,
                 "resident_bytes": self.transcriber.bytes},
                {**base, "id": speaker.MODEL_ID, "kind": "speech", "loaded": not problem,
                 "aliases": list(SPEECH_ALIASES), "capabilities": ["speech"], "size_bytes": 0,
                 "voices": voices, **problem}]
