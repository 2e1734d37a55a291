"""A model's shape as the planner needs it, read from a GGUF header (tensor infos and
metadata, never the weights): bytes per layer and where they lie in the file, the
attention shape for the KV cache, and for mixture-of-experts models the routed experts
of every layer (the tensors llama.cpp's `--cpu-moe` keeps in RAM) and how many of them
each token reads."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

KV_BYTES = {"f16": 2.0, "q8_0": 34 / 32}  # per element
# Tensors llama.cpp's CPU backend copies into a repacked buffer on x86 with AVX2 (rows in
# groups of 8): on the CPU they count twice (mapped and repacked).
REPACKED = {"Q4_0", "Q4_K", "IQ4_NL", "MXFP4"}
# The routed experts, as llama.cpp's --cpu-moe names them (LLM_FFN_EXPS_REGEX): their
# weights and biases; shared experts (`_shexp`) and the router (`_inp`) do not match.
EXPERT_TENSORS = r"ffn_(up|down|gate_up|gate)_(ch|)exps"
EXPERTS = re.compile(rf"\.{EXPERT_TENSORS}")
SHARED_EXPERTS = re.compile(r"\.ffn_(up|down|gate)_shexp")
Span = tuple[int, int]


@dataclass(frozen=True)
class ModelShape:
    name: str
    n_layers: int
    n_embd: int
    n_ff: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    context_length: int
    layer_bytes: tuple[int, ...]
    embd_bytes: int
    output_bytes: int  # 0 when the output reuses the token embeddings (tied)
    other_bytes: int = 0
    # File offsets (start, end) of each layer's tensors, and of the tensors that always
    # stay on the CPU: llama.cpp maps the span of a device's tensors, gaps included.
    layer_spans: tuple[Span, ...] = ()
    cpu_span: Span = (0, 0)
    output_span: Span = (0, 0)
    # Repacked bytes (REPACKED) per layer and of the output matrix.
    layer_repack: tuple[int, ...] = ()
    output_repack: int = 0
    # Mixture of experts: routed expert bytes per layer (0 for dense layers), their file
    # spans and repacked bytes, the expert count and how many each token uses.
    expert_bytes: tuple[int, ...] = ()
    expert_spans: tuple[Span, ...] = ()
    expert_repack: tuple[int, ...] = ()
    n_expert: int = 0
    n_expert_used: int = 0
    shared_expert_bytes: int = 0
    # Weights' element counts (for prompt FLOPs): all of them, and the routed experts'.
    n_params: int = 0
    expert_params: int = 0
    architecture: str = ""  # general.architecture: some placements depend on it

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0 and any(self.expert_bytes)

    @property
    def dense_leading_layers(self) -> int:
        """Layers before the first with routed experts (DeepSeek, GLM: dense first)."""
        return next((i for i, b in enumerate(self.expert_bytes) if b), self.n_layers)

    @property
    def active_fraction(self) -> float:
        """The share of a layer's routed expert bytes one token reads (top-k of n)."""
        return self.n_expert_used / self.n_expert if self.n_expert else 1.0

    def experts(self, layer: int) -> int:
        return self.expert_bytes[layer] if self.expert_bytes else 0

    def read_per_token(self, layer: int) -> tuple[int, float]:
        """The weight bytes one generated token reads in `layer`: (all but its routed
        experts, its routed experts at the share the router picks)."""
        experts = self.experts(layer)
        return self.layer_bytes[layer] - experts, experts * self.active_fraction

    def weights_read_per_token(self) -> float:
        """Every layer's bytes by read_per_token, and the output matrix (the token
        embeddings when tied); of the token embeddings otherwise only a row, nothing."""
        layers = sum(sum(self.read_per_token(i)) for i in range(len(self.layer_bytes)))
        return layers + (self.output_bytes or self.embd_bytes)

    def mapped_bytes(self, cpu_layers: int, output_on_cpu: bool, cpu_moe: int = 0) -> int | None:
        """What llama.cpp's CPU_Mapped buffer covers with the first `cpu_layers` layers on
        the CPU and the routed experts of the first `cpu_moe` there too; None when the
        offsets are unknown."""
        if not self.layer_spans:
            return None
        spans = [self.cpu_span, *self.layer_spans[:cpu_layers]]
        spans += [s for s in self.expert_spans[cpu_layers:cpu_moe] if s != (0, 0)]
        if output_on_cpu and self.output_span != (0, 0):
            spans.append(self.output_span)
        return max(end for _, end in spans) - min(start for start, _ in spans)

    @property
    def weights_bytes(self) -> int:
        return sum(self.layer_bytes) + self.embd_bytes + self.output_bytes + self.other_bytes

    def kv_bytes_per_token(self, kv_type: str) -> float:
        """For one layer."""
        return self.n_head_kv * (self.head_dim_k + self.head_dim_v) * KV_BYTES[kv_type]

    def scaled(self, name: str, file_bytes: int) -> "ModelShape":
        """The same model in another quantization of the given size (before download)."""
        ratio = file_bytes / self.weights_bytes

        def scale(sizes):
            return tuple(int(b * ratio) for b in sizes)

        return replace(self, name=name, layer_bytes=scale(self.layer_bytes),
                       embd_bytes=int(self.embd_bytes * ratio),
                       output_bytes=int(self.output_bytes * ratio),
                       expert_bytes=scale(self.expert_bytes),
                       shared_expert_bytes=int(self.shared_expert_bytes * ratio),
                       layer_spans=(), expert_spans=(), layer_repack=(), output_repack=0,
                       expert_repack=())


def field_value(reader, key: str, default=None):
    """A GGUF metadata field's value, or `default` when the file has no such key."""
    field = reader.fields.get(key)
    return default if field is None else field.contents()


def _repacked(tensor) -> int:
    rows = int(tensor.shape[1]) if len(tensor.shape) > 1 else 0
    return int(tensor.n_bytes) if tensor.tensor_type.name in REPACKED and rows % 8 == 0 else 0


def _union(a: Span | None, b: Span) -> Span:
    return b if a is None else (min(a[0], b[0]), max(a[1], b[1]))


class _Tally:
    """Bytes, repacked bytes and file spans, per key (a layer index, "cpu", "output")."""

    def __init__(self):
        self.bytes: dict = {}
        self.repack: dict = {}
        self.spans: dict = {}

    def add(self, key, tensor) -> None:
        self.bytes[key] = self.bytes.get(key, 0) + int(tensor.n_bytes)
        self.repack[key] = self.repack.get(key, 0) + _repacked(tensor)
        start = int(tensor.data_offset)
        self.spans[key] = _union(self.spans.get(key), (start, start + int(tensor.n_bytes)))

    def per_layer(self, table: dict, n_layers: int, empty=0) -> tuple:
        return tuple(table.get(i, empty) for i in range(n_layers))


def _sort_tensors(reader) -> tuple[_Tally, _Tally, dict]:
    """Each tensor's bytes under its layer ("cpu" and "output" for the rest), the routed
    experts' again apart, and counts: token embedding and shared expert bytes, elements."""
    layers, experts = _Tally(), _Tally()
    counts = {"embd": 0, "shared": 0, "params": 0, "expert_params": 0}
    for tensor in reader.tensors:
        elements = int(tensor.n_elements) if len(tensor.shape) > 1 else 0
        counts["params"] += elements
        if tensor.name.startswith("blk."):
            index = int(tensor.name.split(".")[1])
            layers.add(index, tensor)
            if EXPERTS.search(tensor.name):
                experts.add(index, tensor)
                counts["expert_params"] += elements
            elif SHARED_EXPERTS.search(tensor.name):
                counts["shared"] += int(tensor.n_bytes)
        elif tensor.name == "output.weight":
            layers.add("output", tensor)
        elif tensor.name.startswith("output_norm."):  # goes with the output matrix
            layers.add("output_norm", tensor)
            layers.spans["output"] = _union(layers.spans.get("output"), layers.spans["output_norm"])
        else:
            counts["embd"] += int(tensor.n_bytes) if tensor.name == "token_embd.weight" else 0
            layers.add("cpu", tensor)
    return layers, experts, counts


def _attention(reader, arch: str) -> dict:
    """The widths and the attention shape (for the KV cache) from the metadata."""
    n_embd = int(field_value(reader, f"{arch}.embedding_length"))
    n_head = int(field_value(reader, f"{arch}.attention.head_count"))
    n_head_kv = field_value(reader, f"{arch}.attention.head_count_kv", n_head)
    if isinstance(n_head_kv, list):  # per-layer counts: plan for the largest
        n_head_kv = max(n_head_kv)
    head_dim = n_embd // n_head
    return {"n_embd": n_embd, "n_head_kv": int(n_head_kv),
            "n_ff": int(field_value(reader, f"{arch}.feed_forward_length", 4 * n_embd)),
            "head_dim_k": int(field_value(reader, f"{arch}.attention.key_length", head_dim)),
            "head_dim_v": int(field_value(reader, f"{arch}.attention.value_length", head_dim)),
            "context_length": int(field_value(reader, f"{arch}.context_length", 0))}


def shape_of(reader, name: str) -> ModelShape:
    """Layer sizes, attention shape and experts from a GGUF reader's tensors and metadata."""
    arch = field_value(reader, "general.architecture")
    n = int(field_value(reader, f"{arch}.block_count"))
    layers, experts, counts = _sort_tensors(reader)
    embd = counts["embd"]
    return ModelShape(
        name=name, n_layers=n, **_attention(reader, arch), n_vocab=_vocabulary_size(reader),
        layer_bytes=layers.per_layer(layers.bytes, n), embd_bytes=embd,
        output_bytes=layers.bytes.get("output", 0),
        other_bytes=layers.bytes.get("cpu", 0) - embd + layers.bytes.get("output_norm", 0),
        layer_spans=layers.per_layer(layers.spans, n),
        cpu_span=layers.spans.get("cpu", (0, 0)), output_span=layers.spans.get("output", (0, 0)),
        layer_repack=layers.per_layer(layers.repack, n),
        output_repack=layers.repack.get("output", 0),
        expert_bytes=experts.per_layer(experts.bytes, n),
        expert_spans=experts.per_layer(experts.spans, n, (0, 0)),
        expert_repack=experts.per_layer(experts.repack, n),
        n_expert=int(field_value(reader, f"{arch}.expert_count", 0) or 0),
        n_expert_used=int(field_value(reader, f"{arch}.expert_used_count", 0) or 0),
        shared_expert_bytes=counts["shared"], n_params=counts["params"],
        expert_params=counts["expert_params"], architecture=arch)


def _vocabulary_size(reader) -> int:
    """The rows of the token embeddings (a header-only file may carry no tokenizer)."""
    embeddings = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embeddings is not None and len(embeddings.shape) == 2:
        return int(embeddings.shape[1])
    return len(reader.fields["tokenizer.ggml.tokens"].data)


def shape_or_none(reader, name: str) -> ModelShape | None:
    try:
        return shape_of(reader, name)
    except (KeyError, TypeError, ValueError, IndexError):
        return None
