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

from engine.catalog.gguf_file import open_gguf
from engine.catalog.shape import field_value


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


def weights(base: Path, names: list[str]):
    """The named matrices of `base` as F32 arrays of numpy shape (n_out, n_in), one at a
    time (an 8B model's would not fit in RAM together)."""
    from gguf.quants import dequantize

    tensors = {t.name: t for t in open_gguf(base).tensors}
    for name in names:
        yield name, dequantize(tensors[name].data, tensors[name].tensor_type).astype(np.float32)


def base_facts(spec: LoraSpec, base: Path) -> tuple[str, dict[str, tuple[int, int, float]]]:
    """The base's architecture, and each target's (n_in, n_out, mean |w|), the size judged
    from a few rows (a whole 8B model would take minutes to dequantize); one read of the
    file (a 262k-token vocabulary takes the gguf package 10 s to parse)."""
    from gguf.quants import dequantize

    reader = open_gguf(base)
    tensors = {t.name: t for t in reader.tensors}
    facts = {}
    for name in spec.names():
        tensor = tensors[name]
        rows = dequantize(tensor.data[:16], tensor.tensor_type)
        facts[name] = (int(tensor.shape[0]), int(tensor.shape[1]), float(np.abs(rows).mean()))
    return str(field_value(reader, "general.architecture")), facts


def lora_matrices(spec: LoraSpec, shapes: dict[str, tuple[int, int, float]]):
    """(name, (A, B)) of each target: A (r x n_in) and B (n_out x r), deterministic for the
    seed, sized so that the update changes the answers without drowning the weights."""
    rng = np.random.default_rng(spec.seed)
    for name, (n_in, n_out, size) in shapes.items():
        a = rng.standard_normal((spec.rank, n_in)) / np.sqrt(n_in)
        b = rng.standard_normal((n_out, spec.rank))
        b *= spec.strength * size * np.sqrt(n_in) / (spec.alpha / spec.rank)
        yield name, (a.astype(np.float32), b.astype(np.float32))


def write_lora(base: Path, target: Path, spec: LoraSpec = LoraSpec(),
               base_name: str | None = None) -> Path:
    """An adapter for `base`; `base_name` goes to general.base_model.0.name, as converted
    adapters carry it."""
    arch, shapes = base_facts(spec, base)
    return write_shaped(target, arch, shapes, spec, base_name)


def write_shaped(target: Path, arch: str, shapes: dict[str, tuple[int, int, float]],
                 spec: LoraSpec = LoraSpec(), base_name: str | None = None) -> Path:
    """An adapter for an `arch` model whose targets have these (n_in, n_out, mean |w|),
    without reading the model."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(target), arch=arch)
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", spec.alpha)
    writer.add_name(target.stem)
    if base_name:
        writer.add_uint32("general.base_model.count", 1)
        writer.add_string("general.base_model.0.name", base_name)
    for name, (a, b) in lora_matrices(spec, shapes):
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
    return _rewritten(base, target, dict(weights(base, names)))


def merged(base: Path, adapter_spec: LoraSpec, scale: float, target: Path) -> Path:
    """A copy of `base` with the adapter merged: W + scale * (alpha / r) * B A in F32."""
    factor = scale * adapter_spec.alpha / adapter_spec.rank
    originals = dict(weights(base, adapter_spec.names()))
    _, shapes = base_facts(adapter_spec, base)
    new = {name: originals[name] + np.float32(factor) * (b @ a)
           for name, (a, b) in lora_matrices(adapter_spec, shapes)}
    return _rewritten(base, target, new)


def _rewritten(base: Path, target: Path, replaced: dict[str, np.ndarray]) -> Path:
    """A copy of `base`, metadata and all, with some tensors replaced by F32 arrays."""
    from gguf import GGUFValueType, GGUFWriter

    reader = open_gguf(base)
    writer = GGUFWriter(str(target), arch=field_value(reader, "general.architecture"))
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
