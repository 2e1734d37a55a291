"""Each model's own sampling defaults: what a request that leaves temperature, top-p,
top-k or min-p out is sampled with.

One temperature for every model fails the small ones: at 0.7 / top-p 0.95 the 135M
starter answers "What is the capital of France?" with nonsense. Even its authors' 0.2 /
0.9 does one time in three (13 of 20 seeds, the same in llama-server): the answer's first
token is a near tie (The 0.19, La 0.17, Le 0.16, L' 0.11), and any temperature lets the
French openings win. Greedy decoding with a light frequency penalty (it stops the loops a
tiny greedy model falls into) answers it right and writes readable prose. So the defaults
come, in this order, from the parameters Ollama keeps for the model (its `params` layer,
for a model used in place from Ollama's folder), from the model file's
`general.sampling.*` keys (llama.cpp's LLAMA_MODEL_META_KEY_SAMPLING_*), from the Hub
repository's `generation_config.json` (kept beside the file when downloaded), or from a
conservative choice by the model's size. Pure: no llama.cpp.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..sampling_limits import within
from .gguf_file import GGUFInfo

# (parameters up to, temperature, top-p, frequency penalty): smaller models wander sooner
# at a high temperature; top-k 40 and min-p 0.05 (llama.cpp's defaults) cut the tail.
BY_SIZE = ((0.5e9, 0.0, 1.0, 0.3), (1.5e9, 0.2, 0.9, 0.0), (4.5e9, 0.5, 0.9, 0.0),
           (float("inf"), 0.7, 0.9, 0.0))
TOP_K, MIN_P = 40, 0.05
TOP_K_CHOSEN = 1000  # above: no author's choice, a mistake in the file
SIDECAR_SUFFIX = ".generation_config.json"

# The file's key, or generation_config.json's, for each of ours.
FILE_KEYS = {"temperature": "temp", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p"}
CONFIG_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
               "min_p": "min_p"}


@dataclass(frozen=True)
class ModelDefaults:
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    frequency_penalty: float
    source: str  # in words: where they came from

    def as_dict(self) -> dict:
        return asdict(self)


def sidecar_of(model_path: Path) -> Path:
    """Where a downloaded model's generation_config.json is kept."""
    return model_path.with_name(model_path.name.removesuffix(".gguf") + SIDECAR_SUFFIX)


def by_size(n_params: float) -> ModelDefaults:
    temperature, top_p, penalty = next(row[1:] for row in BY_SIZE if n_params <= row[0])
    billions = f"{n_params / 1e9:.1f}B" if n_params >= 1e9 else f"{n_params / 1e6:.0f}M"
    return ModelDefaults(temperature, top_p, TOP_K, MIN_P, penalty,
                         f"Homerack's default for a {billions} model")


def model_defaults(info: GGUFInfo, params: tuple = ()) -> ModelDefaults:
    """The defaults for the model `info` describes, with its app's `params` ((key, value)
    pairs, Ollama's names) when it has them (see the module's docstring)."""
    base = by_size(_n_params(info))
    from_app = _chosen(dict(params), CONFIG_KEYS)
    if from_app:
        return replace(base, frequency_penalty=0.0, **from_app,
                       source="the parameters Ollama keeps for it")
    from_file = _chosen(info.sampling or {}, FILE_KEYS)
    # the authors' values replace the size rule's recipe, its penalty (for greedy) too
    if from_file:
        return replace(base, frequency_penalty=0.0, **from_file,
                       source="the model file's general.sampling keys")
    from_config = _from_config(sidecar_of(Path(info.path)))
    if from_config:
        return replace(base, frequency_penalty=0.0, **from_config,
                       source="the model's generation_config.json")
    return base


def _n_params(info: GGUFInfo) -> float:
    if info.shape is not None and info.shape.n_params:
        return info.shape.n_params
    return info.size_bytes * 2  # about 4.5 bits a weight, the common quantization


def _from_config(path: Path) -> dict:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(config, dict):
        return {}
    if config.get("do_sample") is False:  # the authors decode greedily
        return {"temperature": 0.0}
    return _chosen(config, CONFIG_KEYS)


def _chosen(values: dict, keys: dict[str, str]) -> dict:
    """Our fields from `values` under `keys`, those a request could set only (the API's
    bounds), and a top_k a model's authors would plausibly choose."""
    chosen = {}
    for ours, theirs in keys.items():
        value = values.get(theirs)
        if within(ours, value) and not (ours == "top_k" and value > TOP_K_CHOSEN):
            chosen[ours] = int(value) if ours == "top_k" else float(value)
    return chosen
