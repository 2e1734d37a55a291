"""LoRA adapters: what a file holds and which base models it fits, from GGUF headers.

An adapter GGUF (`general.type = adapter`, `adapter.type = lora`) carries, for each
matrix W it adapts, `<W>.lora_a` (ggml dims n_in x r) and `<W>.lora_b` (r x n_out), and
`adapter.lora.alpha`. llama.cpp refuses an adapter whose architecture or shapes differ
from the model's, but a damaged one (an unsupported tensor type) crashed it in a test
here, so every adapter is checked against its base before llama.cpp sees it. The checks
are llama.cpp's own (llama-adapter.cpp): the same architecture, every adapted tensor
present in the base, A's n_in and B's n_out equal to the base tensor's, A's rank B's.
"""

from __future__ import annotations

import re
from collections import Counter

from ..errors import InvalidModelFile
from .shape import field_value

# lora_a / lora_b types llama.cpp multiplies with (convert_lora_to_gguf.py writes these)
ADAPTER_TYPES = {"F32", "F16", "BF16", "Q8_0"}
_BLOCK = re.compile(r"^blk\.(\d+)\.(.+)$")


def matrix_shapes(reader) -> dict[str, list[int]]:
    """The ggml dims of a model's weight tensors (two dims or more), by name; a block
    tensor whose shape is the same in every layer is kept once, as `blk.*.<name>`."""
    by_kind: dict[str, dict[int, tuple]] = {}
    out: dict[str, list[int]] = {}
    for tensor in reader.tensors:
        dims = tuple(int(d) for d in tensor.shape)
        if len(dims) < 2:
            continue
        match = _BLOCK.match(tensor.name)
        if match:
            by_kind.setdefault(match[2], {})[int(match[1])] = dims
        else:
            out[tensor.name] = list(dims)
    for kind, layers in by_kind.items():
        if len(set(layers.values())) == 1:
            out[f"blk.*.{kind}"] = list(next(iter(layers.values())))
        else:
            out.update({f"blk.{i}.{kind}": list(dims) for i, dims in layers.items()})
    return out


def shape_in(matrices: dict, name: str) -> list[int] | None:
    """A tensor's dims in a model's `matrix_shapes`, or None when it has no such tensor."""
    if name in matrices:
        return matrices[name]
    match = _BLOCK.match(name)
    return matrices.get(f"blk.*.{match[2]}") if match else None


def adapter_facts(reader, file_name: str) -> dict:
    """What an adapter GGUF holds: alpha, rank, the base tensors it adapts with their
    (n_in, n_out), and the base model names it declares. InvalidModelFile for a file
    llama.cpp could not use safely."""
    def damaged(why: str) -> InvalidModelFile:
        return InvalidModelFile(f"{file_name} is not a usable LoRA adapter: {why}",
                                param="lora")

    kind = field_value(reader, "adapter.type")
    if kind != "lora":
        raise damaged(f"its adapter.type is {kind!r}, and only 'lora' adapters are supported")
    pairs: dict[str, dict[str, object]] = {}
    for tensor in reader.tensors:
        base, _, part = tensor.name.rpartition(".")
        if part not in ("lora_a", "lora_b"):
            raise damaged(f"tensor {tensor.name} is neither a lora_a nor a lora_b")
        if tensor.tensor_type.name not in ADAPTER_TYPES:
            raise damaged(f"tensor {tensor.name} is {tensor.tensor_type.name}; adapters hold "
                          f"{', '.join(sorted(ADAPTER_TYPES))}")
        pairs.setdefault(base, {})[part] = tuple(int(d) for d in tensor.shape)
    if not pairs:
        raise damaged("it holds no tensors")
    targets, ranks = {}, Counter()
    for base, pair in pairs.items():
        a, b = pair.get("lora_a"), pair.get("lora_b")
        if a is None or b is None:
            raise damaged(f"{base} has a lora_{'b' if a is None else 'a'} only")
        if len(a) < 2 or len(b) < 2 or a[1] != b[0]:
            raise damaged(f"{base}: lora_a {list(a)} and lora_b {list(b)} do not share a rank")
        targets[base] = [a[0], b[1]]
        ranks[a[1]] += 1
    count = int(field_value(reader, "general.base_model.count", 0) or 0)
    names = [field_value(reader, f"general.base_model.{i}.{key}")
             for i in range(count) for key in ("name", "repo_url")]
    return {"alpha": float(field_value(reader, "adapter.lora.alpha", 0.0) or 0.0),
            "rank": ranks.most_common(1)[0][0], "targets": targets,
            "base_names": [str(n) for n in names if n]}


def misfit(adapter, base, base_id: str) -> str | None:
    """Why the adapter (a GGUFInfo with `adapter` facts) cannot apply to `base` (a
    GGUFInfo), in words; None when it fits."""
    if base.adapter is not None:
        return f"{base_id} is itself an adapter"
    if base.embedding:
        return f"{base_id} is an embedding model"
    if adapter.architecture != base.architecture:
        return (f"it adapts {adapter.architecture} models and {base_id} is a "
                f"{base.architecture} model")
    for name, (n_in, n_out) in adapter.adapter["targets"].items():
        dims = shape_in(base.matrices or {}, name)
        if dims is None:
            return f"{base_id} has no tensor {name}"
        if (dims[0], dims[1]) != (n_in, n_out):
            return (f"{name} is {n_in}x{n_out} in the adapter and {dims[0]}x{dims[1]} in "
                    f"{base_id} (a model of another size)")
    return None


def declares(adapter, base, base_id: str) -> bool:
    """The adapter names this base (general.base_model.*) by its name or repository."""
    wanted = [n.lower().rstrip("/").rsplit("/", 1)[-1] for n in adapter.adapter["base_names"]]
    have = {base.name.lower(), base_id.lower()}
    return any(w and any(w in h or h in w for h in have) for w in wanted)
