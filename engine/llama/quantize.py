"""Requantizing a model file with llama.cpp: a heavier model of the same vocabulary as a
small one (the speculation bench and tests draft for such a target)."""

from __future__ import annotations

from pathlib import Path

import llama_cpp as llama


def requantize(source: Path, target: Path, ftype: int, threads: int = 0) -> Path:
    """Write `source` requantized to llama.cpp file type `ftype` (0 = all F32, 1 = F16)."""
    params = llama.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = threads
    tmp = target.with_name(target.name + ".partial")
    if llama.llama_model_quantize(str(source).encode(), str(tmp).encode(), params) != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp could not requantize {source.name}")
    tmp.replace(target)
    return target
