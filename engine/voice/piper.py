"""Piper's neural voices in a child process of its own: `python -m engine.voice.piper
MEMORY_BYTES`, the same protocol as the eSpeak child (espeak.py), a voice named by its
`.onnx` file:

    {"text": T, "voice": PATH, "speed": S}    -> {"bytes": N, "rate": R} + N bytes (int16)
                                              or {"error": "...", "param": "voice"}

A Piper voice is a VITS model in ONNX and its `.onnx.json` (sample rate, phoneme ids,
the eSpeak voice it was trained with). Text becomes phonemes by eSpeak NG (its C API, as
Piper does: clause by clause, each clause's punctuation kept), phonemes become ids by the
voice's map, and onnxruntime turns them into samples. piper-onnx (MIT) does the same with
phonemizer, which is GPL and drops punctuation; these few lines use the eSpeak already
here. eSpeak runs in this child because it can crash (espeak.py): a voice that fails
costs its request, never the engine. Each voice is checked before its first use (its
JSON, its rate, the graph's inputs): a damaged one is an error naming what is wrong.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

import numpy as np

from .espeak import ESpeak, _send

CLAUSE = re.compile(r"([^,.!?;:]+)([,.!?;:]*)")
RATES = (16000, 22050, 24000, 44100, 48000)  # what Piper's voices are made at
INPUTS = {"input", "input_lengths", "scales"}
VOICES_HELD = 2  # voices whose sessions stay loaded in the child


class BadVoice(Exception):
    """A voice file that cannot be used, and why."""


class PiperVoice:
    def __init__(self, model: Path):
        self.config = _config(model)
        self.rate = self.config["audio"]["sample_rate"]
        self.ids = self.config["phoneme_id_map"]
        self.espeak_voice = self.config.get("espeak", {}).get("voice", "en-us")
        self.inference = self.config.get("inference", {})
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = min(4, os.cpu_count() or 1)
        try:
            self.session = ort.InferenceSession(str(model), options,
                                                providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's own errors: a damaged graph
            raise BadVoice(f"{model.name} is not a model onnxruntime can read "
                           f"({str(exc).splitlines()[0][:200]})") from None
        names = {i.name for i in self.session.get_inputs()}
        if not INPUTS <= names:
            raise BadVoice(f"{model.name} is not a Piper voice: its inputs are "
                           f"{sorted(names)}, not {sorted(INPUTS)}")
        self.speakers = "sid" in names

    def ids_of(self, phonemes: str) -> list[int]:
        """Piper's layout: BOS, each phoneme's ids each followed by the pad, EOS."""
        pad = self.ids["_"]
        out = list(self.ids["^"]) + list(pad)
        for p in phonemes:
            if p in self.ids:
                out += self.ids[p] + pad
        return out + list(self.ids["$"])

    def say(self, espeak: ESpeak, text: str, speed: float) -> bytes:
        phonemes = " ".join(f"{espeak.phonemes(words, self.espeak_voice)}{marks}"
                            for words, marks in CLAUSE.findall(text) if words.strip())
        ids = self.ids_of(phonemes)
        scales = np.array([self.inference.get("noise_scale", 0.667),
                           self.inference.get("length_scale", 1.0) / speed,
                           self.inference.get("noise_w", 0.8)], dtype=np.float32)
        feed = {"input": np.array([ids], dtype=np.int64),
                "input_lengths": np.array([len(ids)], dtype=np.int64), "scales": scales}
        if self.speakers:
            feed["sid"] = np.array([0], dtype=np.int64)
        audio = self.session.run(None, feed)[0].reshape(-1)
        peak = float(np.max(np.abs(audio))) if audio.size else 0.0
        audio = audio / max(peak, 1e-4) * 0.9 if peak > 1.0 else audio  # no clipping
        return (np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes()


def _config(model: Path) -> dict:
    """The voice's JSON, checked: what synthesis reads must be there and sane."""
    path = model.with_name(model.name + ".json")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadVoice(f"{model.name} has no {path.name} beside it (a Piper voice is the "
                       ".onnx file and its .onnx.json)") from None
    except (OSError, ValueError) as exc:
        raise BadVoice(f"{path.name} is not readable JSON ({exc})") from None
    rate = config.get("audio", {}).get("sample_rate") if isinstance(config, dict) else None
    if rate not in RATES:
        raise BadVoice(f"{path.name}: audio.sample_rate is {rate!r}, not one of "
                       f"{', '.join(map(str, RATES))}")
    ids = config.get("phoneme_id_map")
    if not isinstance(ids, dict) or not all(k in ids for k in "_^$") or not all(
            isinstance(v, list) and all(isinstance(i, int) for i in v) for v in ids.values()):
        raise BadVoice(f"{path.name}: phoneme_id_map is missing or not lists of ids")
    return config


def serve(requests, out) -> None:
    """Answer each request line until stdin closes."""
    espeak, voices = ESpeak(), {}
    for line in requests:
        asked = json.loads(line)
        model = Path(asked["voice"])
        try:
            if model not in voices:
                while len(voices) >= VOICES_HELD:  # each session ~200 MiB: the oldest goes
                    del voices[next(iter(voices))]
                voices[model] = PiperVoice(model)
            voice = voices[model]
            samples = voice.say(espeak, asked["text"], float(asked["speed"]))
        except BadVoice as exc:
            _send(out, {"error": f"voice: {exc}", "param": "voice", "damaged": True})
            continue
        except LookupError:
            _send(out, {"error": f"voice: eSpeak NG has no voice {voice.espeak_voice!r} "
                                 f"for {model.name}", "param": "voice", "damaged": True})
            continue
        _send(out, {"bytes": len(samples), "rate": voice.rate}, samples)


if __name__ == "__main__":
    try:
        import resource

        memory = int(sys.argv[1])
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    except ImportError:
        pass
    answers = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    serve(sys.stdin.buffer, answers)
