"""The speech models as the engine holds them: each loaded on first use (the recogniser let
go again after ten idle minutes, its memory counted beside the chat models' meanwhile),
listed in /v1/models with `kind` "transcription" or "speech"."""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelNotFound, SpeechFailed
from . import speaker, transcriber
from .speaker import PiperSpeaker, Speaker, piper_voices
from .transcriber import Transcriber

# the model ids OpenAI's clients send, answered by the models here
TRANSCRIPTION_ALIASES = ("whisper-1", "gpt-4o-transcribe", "gpt-4o-mini-transcribe")
SPEECH_ALIASES = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")


class Voice:
    def __init__(self, folder: Path, threads: int):
        self.transcriber = Transcriber(folder, threads)
        self.speaker = Speaker()  # eSpeak NG: every language, and the fallback
        files = piper_voices(folder / "piper" if folder else None)
        self.piper = PiperSpeaker(files) if files else None

    @property
    def bytes(self) -> int:
        """RAM the speech models hold now (the synthesizers' children are not counted)."""
        return self.transcriber.bytes

    def transcription_model(self, name: str | None) -> Transcriber:
        if name in (None, "", transcriber.MODEL_ID, *TRANSCRIPTION_ALIASES):
            return self.transcriber
        raise ModelNotFound(f"no speech recognition model is called {name!r} (this engine "
                            f"has {transcriber.MODEL_ID})", param="model")

    def speech_model(self, name: str | None, voice: str | None = None) -> Speaker:
        """The synthesizer of a request: Piper for OpenAI's voice names and its own (the
        default where its voice is installed), eSpeak NG for its own voices (any
        language) or when asked by name."""
        ids = [speaker.MODEL_ID] + ([self.piper.model_id] if self.piper else [])
        if name not in (None, "", *ids, *SPEECH_ALIASES):
            raise ModelNotFound(f"no speech model is called {name!r} (this engine has "
                                f"{', '.join(ids)})", param="model")
        if self.piper and name != speaker.MODEL_ID and \
                (name == self.piper.model_id or self.piper.knows(voice)):
            return self.piper
        return self.speaker

    def models(self) -> list[dict]:
        """The speech models as /v1/models lists them; a synthesizer that cannot start
        is listed as not loaded, with why, and never fails the list."""
        base = {"object": "model", "created": 0, "owned_by": "homerack"}
        try:
            voices, problem = self.speaker.voices(), {}
        except SpeechFailed as exc:
            voices, problem = [], {"error": exc.message}
        listed = [{**base, "id": transcriber.MODEL_ID, "kind": "transcription",
                   "loaded": self.transcriber.loaded, "aliases": list(TRANSCRIPTION_ALIASES),
                   "capabilities": ["transcription", "translation"],
                   "size_bytes": transcriber.MODEL_BYTES,
                   "resident_bytes": self.transcriber.bytes}]
        if self.piper:
            listed.append({**base, "id": self.piper.model_id, "kind": "speech", "loaded": True,
                           "aliases": list(SPEECH_ALIASES), "capabilities": ["speech"],
                           "size_bytes": self.piper.size, "voices": self.piper.voices(),
                           "languages": self.piper.languages})
        listed.append({**base, "id": speaker.MODEL_ID, "kind": "speech", "loaded": not problem,
                       "aliases": [] if self.piper else list(SPEECH_ALIASES),
                       "capabilities": ["speech"], "size_bytes": 0, "voices": voices,
                       "languages": {v: v.split("+")[0] for v in voices
                                     if v not in speaker.OPENAI_VOICES}, **problem})
        return listed
