"""LoRA adapters on llama.cpp: loaded once per model, switched per evaluation.

llama.cpp applies an adapter at run time (W x + s * alpha / r * B (A x), in every matrix
it adapts), so switching costs no reload: `llama_set_adapters_lora` only changes the
context's list when it differs. The model frees its adapters when it is freed.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp as llama

from ..errors import InvalidModelFile
from .runtime import LlamaModel


def load_adapter(model: LlamaModel, path: Path):
    """An adapter of `model` (checked beforehand by catalog.adapters: llama.cpp trusts
    the file's tensor types)."""
    handle = llama.llama_adapter_lora_init(model.model, str(path).encode())
    if not handle:
        raise InvalidModelFile(f"llama.cpp could not load the adapter {path.name} for "
                               f"{model.path.name}", param="lora")
    return handle


def free_adapter(handle) -> None:
    """Free an adapter no evaluation will use again (the context does not apply it)."""
    llama.llama_adapter_lora_free(handle)


def set_adapters(model: LlamaModel, handles: list, scales: list[float]) -> None:
    """Evaluations from now on use these adapters at these scales (none: the model)."""
    n = len(handles)
    array = (llama.llama_adapter_lora_p_ctypes * n)(*handles) if n else None
    factors = (ctypes.c_float * n)(*scales) if n else None
    if llama.llama_set_adapters_lora(model.ctx, array, n, factors) != 0:
        raise InvalidModelFile("llama.cpp refused the adapters", param="lora")
