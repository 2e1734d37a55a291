"""LoRA adapter GGUFs for a base model, and the base with an adapter merged in numpy.

Real adapters cannot be downloaded here; their format can be written. An adapter is a
GGUF with `general.type = adapter`, `adapter.type = lora`, `adapter.lora.alpha`, the
base's architecture, and for each adapted matrix W (n_out x n_in) two F32 tensors:
`<name>.lora_a` (r x n_in) and `<name>.lora_b` (n_out x r). llama.cpp computes
W x + s * (alpha / r) * B (A x); `merged` writes W + s * (alpha / r) * B A instead, the
answer the engine's output is checked against.

`with_float_targets` writes a copy of the base whose adapted matrices are dequantized to
F32: a quantized matrix multiplies a quantized copy of its input, so only against F32
weights do the two ways of computing agree to float rounding.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class LoraSpec:
    rank: int = 4
    alpha: float = 8.0
    targets: tuple[str, ...] = ("attn_q", "ffn_up")  # matrix names in each block
    layers: tuple[int, ...] = tuple(range(6))
    seed: int = 0
    strength: float = 0.05  # the size of B A's entries against the weights'

    def names(self) -> list[str]:
        return [f"blk.{i}.{t}.weight" for i in self.layers for t in self.targets]


def _field(reader, key: str, default=None):
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def weights(base: Path, names: list[str]) -> dict[str, np.ndarray]:
    """The named matrices of `base` as F32 arrays of numpy shape (n_out, n_in)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    tensors = {t.name: t for t in GGUFReader(base, "r").tensors}
    return {name: dequantize(tensors[name].data, tensors[name].tensor_type).astype(np.float32)
            for name in names}


def lora_matrices(spec: LoraSpec, base: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """A (r x n_in) and B (n_out x r) of each target, deterministic for the seed, sized so
    that the update changes the answers without drowning the weights."""
    rng = np.random.default_rng(spec.seed)
    out = {}
    for name, w in weights(base, spec.names()).items():
        n_out, n_in = w.shape
        a = rng.standard_normal((spec.rank, n_in)) / np.sqrt(n_in)
        b = rng.standard_normal((n_out, spec.rank))
        b *= spec.strength * float(np.abs(w).mean()) * np.sqrt(n_in) / (spec.alpha / spec.rank)
        out[name] = (a.astype(np.float32), b.astype(np.float32))
    return out


def write_lora(base: Path, target: Path, spec: LoraSpec = LoraSpec(),
               base_name: str | None = None, arch: str | None = None) -> Path:
    """An adapter for `base` (its architecture unless `arch` says another); `base_name`
    goes to general.base_model.0.name, as converted adapters carry it."""
    from gguf import GGUFReader, GGUFWriter

    reader = GGUFReader(base, "r")
    writer = GGUFWriter(str(target), arch=arch or _field(reader, "general.architecture"))
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", spec.alpha)
    writer.add_name(target.stem)
    if base_name:
        writer.add_uint32("general.base_model.count", 1)
        writer.add_string("general.base_model.0.name", base_name)
    for name, (a, b) in lora_matrices(spec, base).items():
        writer.add_tensor(f"{name}.lora_a", a)
        writer.add_tensor(f"{name}.lora_b", b)
    _write(writer)
    return target


def _write(writer) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def with_float_targets(base: Path, target: Path, names: list[str]) -> Path:
    """A copy of `base` whose named matrices are dequantized to F32."""
    return _rewritten(base, target, weights(base, names))


def merged(base: Path, adapter_spec: LoraSpec, scale: float, target: Path) -> Path:
    """A copy of `base` with the adapter merged: W + scale * (alpha / r) * B A in F32."""
    factor = scale * adapter_spec.alpha / adapter_spec.rank
    originals = weights(base, adapter_spec.names())
    new = {name: originals[name] + np.float32(factor) * (b @ a)
           for name, (a, b) in lora_matrices(adapter_spec, base).items()}
    return _rewritten(base, target, new)


def _rewritten(base: Path, target: Path, replaced: dict[str, np.ndarray]) -> Path:
    """A copy of `base`, metadata and all, with some tensors replaced by F32 arrays."""
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    reader = GGUFReader(base, "r")
    writer = GGUFWriter(str(target), arch=_field(reader, "general.architecture"))
    for field in reader.fields.values():
        if field.name == "general.architecture" or field.name.startswith("GGUF."):
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), kind, sub_type=sub)
    for tensor in reader.tensors:
        if tensor.name in replaced:
            writer.add_tensor(tensor.name, replaced[tensor.name])
        else:
            writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape,
                              raw_dtype=tensor.tensor_type)
    _write(writer)
    return target
