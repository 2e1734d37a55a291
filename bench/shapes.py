"""GGUF files with the exact shape of real models, without their weights.

Throughput does not depend on the values of the weights, and the planner reads only a
file's header, so a model nobody can download here can still be planned for and timed:

- `write_header_only(spec, path)`: the real metadata and tensor infos (no tokenizer), the
  data region a sparse hole (a 142 GB model takes a few kB of disk);
- `write_random(spec, path, donor)`: the same, filled with random but valid quant blocks
  (finite scales, so the logits are finite) and the donor GGUF's tokenizer, so llama.cpp
  loads and runs it at the real model's speed;
- `cached(spec, kind)`: either, written once per shape under .cache/shapes.

One writer serves every benchmark and test. Quantizations follow llama.cpp's Q4_K_M
recipe (attn_v and ffn_down in Q6_K on the layers `use_more_bits` picks, the output in
Q6_K, rows that are not a multiple of 256 in Q5_0/Q8_0); gpt-oss keeps its experts in
MXFP4 and the rest in BF16 as ggml-org's conversion does. `SHAPES` holds the real models
(their published config.json) with the file size their Hub repositories list; the small
`*-tiny` specs carry each MoE architecture's real tensor names and metadata keys."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engine.catalog.gguf_file import open_gguf

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "shapes"
GB = 1e9
LAYOUT = 3  # the writer's version, in each cached file's name: a new layout, new files
NORMAL_TOKEN = 1  # llama.cpp's LLAMA_TOKEN_TYPE_NORMAL


@dataclass(frozen=True)
class Spec:
    name: str
    arch: str
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    n_vocab: int
    ctx: int
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0      # shared experts' width (0: none)
    dense_first: int = 0     # leading dense layers (DeepSeek, GLM)
    moe_step: int = 1        # every moe_step-th layer has experts (Llama 4 Maverick: 2)
    qk_norm: bool = False
    attn_bias: bool = False
    gpt_oss: bool = False    # biases on attention, router and experts; attention sinks
    mla: bool = False        # DeepSeek's latent attention
    nextn: int = 0           # trailing multi-token-prediction layers (GLM 4.5)
    mix: str = "Q4_K_M"      # or "MXFP4" (gpt-oss), "Q8_0"
    tied: bool = False       # the token embeddings are the output matrix (no output.weight)
    published_gb: float = 0  # the file's size on the Hub, for the check

    def is_moe_layer(self, i: int) -> bool:
        return bool(self.n_expert) and i >= self.dense_first and i % self.moe_step == self.moe_step - 1


SHAPES = {s.name: s for s in (
    Spec("qwen3-1.7b", "qwen3", 28, 2048, 16, 8, 128, 6144, 151936, 40960, qk_norm=True,
         tied=True, published_gb=1.11),
    Spec("llama-3.2-3b", "llama", 28, 3072, 24, 8, 128, 8192, 128256, 131072, tied=True,
         published_gb=2.02),
    Spec("qwen3-8b", "qwen3", 36, 4096, 32, 8, 128, 12288, 151936, 40960, qk_norm=True,
         published_gb=5.03),
    Spec("llama-3.3-70b", "llama", 80, 8192, 64, 8, 128, 28672, 128256, 131072,
         published_gb=42.5),
    Spec("qwen3-30b-a3b", "qwen3moe", 48, 2048, 32, 4, 128, 6144, 151936, 40960,
         n_expert=128, n_expert_used=8, n_ff_exp=768, qk_norm=True, published_gb=18.6),
    # Qwen3-30B-A3B's layers (128 experts, top 8) but 8 of its 48: runs in this machine's RAM
    Spec("qwen3-30b-a3b-8l", "qwen3moe", 8, 2048, 32, 4, 128, 6144, 151936, 40960,
         n_expert=128, n_expert_used=8, n_ff_exp=768, qk_norm=True),
    Spec("qwen3-235b-a22b", "qwen3moe", 94, 4096, 64, 4, 128, 12288, 151936, 40960,
         n_expert=128, n_expert_used=8, n_ff_exp=1536, qk_norm=True, published_gb=142.7),
    Spec("glm-4.5-air", "glm4moe", 46, 4096, 96, 8, 128, 10944, 151552, 131072,
         n_expert=128, n_expert_used=8, n_ff_exp=1408, n_ff_shexp=1408, dense_first=1,
         attn_bias=True, nextn=1, published_gb=72.9),
    Spec("gpt-oss-120b", "gpt-oss", 36, 2880, 64, 8, 64, 2880, 201088, 131072,
         n_expert=128, n_expert_used=4, n_ff_exp=2880, gpt_oss=True, mix="MXFP4",
         published_gb=63.4),
    # each MoE architecture's naming, small
    Spec("deepseek2-tiny", "deepseek2", 6, 512, 8, 1, 64, 1024, 1000, 4096, n_expert=16,
         n_expert_used=4, n_ff_exp=256, n_ff_shexp=256, dense_first=2, mla=True),
    Spec("llama4-tiny", "llama4", 6, 512, 8, 2, 64, 1024, 1000, 4096, n_expert=16,
         n_expert_used=1, n_ff_exp=512, n_ff_shexp=512, moe_step=2),
    Spec("mixtral-tiny", "llama", 4, 512, 8, 2, 64, 1024, 1000, 4096, n_expert=8,
         n_expert_used=2, n_ff_exp=1024),
    Spec("granitemoe-tiny", "granitemoe", 4, 512, 8, 2, 64, 512, 1000, 4096, n_expert=32,
         n_expert_used=8, n_ff_exp=512),
    Spec("olmoe-tiny", "olmoe", 4, 512, 8, 8, 64, 1024, 1000, 4096, n_expert=64,
         n_expert_used=8, n_ff_exp=256, qk_norm=True),
    Spec("qwen3moe-tiny", "qwen3moe", 4, 512, 8, 2, 64, 1024, 1000, 4096, n_expert=16,
         n_expert_used=4, n_ff_exp=256, qk_norm=True),
    Spec("glm4moe-tiny", "glm4moe", 4, 512, 8, 2, 64, 1024, 1000, 4096, n_expert=16,
         n_expert_used=4, n_ff_exp=256, n_ff_shexp=256, dense_first=1, attn_bias=True,
         nextn=1),
    Spec("gpt-oss-tiny", "gpt-oss", 4, 512, 8, 2, 64, 512, 1000, 4096, n_expert=16,
         n_expert_used=4, n_ff_exp=512, gpt_oss=True, mix="MXFP4"),
)}

# The random-weight MoE that runs here: Qwen3-MoE's layout with 16 experts, top-4, with
# valid Q4_K/Q6_K blocks; small enough for a 2-core machine, experts most of its bytes.
RUNNABLE_MOE = Spec("qwen3moe-16x", "qwen3moe", 8, 512, 8, 2, 64, 1536, 0, 4096,
                    n_expert=16, n_expert_used=4, n_ff_exp=512, qk_norm=True)
SHAPES[RUNNABLE_MOE.name] = RUNNABLE_MOE


def _use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the layers whose attn_v and ffn_down get Q6_K in Q4_K_M."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _quant(spec: Spec, role: str, layer: int, ne0: int) -> str:
    if role in ("norm", "bias", "router"):
        return "F32"
    if spec.mix == "MXFP4":
        return "MXFP4" if role.startswith("exps") else "BF16"
    if spec.mix == "Q8_0":
        return "Q8_0"
    if role == "output":
        wanted = "Q6_K"
    elif role in ("attn_v", "ffn_down", "exps_down") and _use_more_bits(layer, spec.n_layers):
        wanted = "Q6_K"
    else:
        wanted = "Q4_K"
    if ne0 % 256:  # k-quants need rows in blocks of 256: llama.cpp's fallbacks
        return {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[wanted]
    return wanted


def _attention(spec: Spec, p: str) -> list:
    e, h, kv, d = spec.n_embd, spec.n_head, spec.n_head_kv, spec.head_dim
    if spec.mla:  # DeepSeek: low-rank query and a 512 + 64 latent KV
        rank, rope = 4 * d, d // 2
        return [(f"{p}.attn_q_a.weight", (e, rank), "attn"),
                (f"{p}.attn_q_a_norm.weight", (rank,), "norm"),
                (f"{p}.attn_q_b.weight", (rank, h * (d + rope)), "attn"),
                (f"{p}.attn_kv_a_mqa.weight", (e, 4 * d + rope), "attn"),
                (f"{p}.attn_kv_a_norm.weight", (4 * d,), "norm"),
                (f"{p}.attn_k_b.weight", (d, 4 * d, h), "attn"),
                (f"{p}.attn_v_b.weight", (4 * d, d, h), "attn_v"),
                (f"{p}.attn_output.weight", (h * d, e), "attn")]
    out = [(f"{p}.attn_q.weight", (e, h * d), "attn"), (f"{p}.attn_k.weight", (e, kv * d), "attn"),
           (f"{p}.attn_v.weight", (e, kv * d), "attn_v"),
           (f"{p}.attn_output.weight", (h * d, e), "attn")]
    if spec.qk_norm:
        out += [(f"{p}.attn_q_norm.weight", (d,), "norm"), (f"{p}.attn_k_norm.weight", (d,), "norm")]
    if spec.attn_bias or spec.gpt_oss:
        out += [(f"{p}.attn_q.bias", (h * d,), "bias"), (f"{p}.attn_k.bias", (kv * d,), "bias"),
                (f"{p}.attn_v.bias", (kv * d,), "bias")]
    if spec.gpt_oss:
        out += [(f"{p}.attn_output.bias", (e,), "bias"), (f"{p}.attn_sinks.weight", (h,), "norm")]
    return out


def _ffn(spec: Spec, p: str, i: int) -> list:
    e = spec.n_embd
    if not spec.is_moe_layer(i):
        return [(f"{p}.ffn_gate.weight", (e, spec.n_ff), "ffn"),
                (f"{p}.ffn_up.weight", (e, spec.n_ff), "ffn"),
                (f"{p}.ffn_down.weight", (spec.n_ff, e), "ffn_down")]
    n, f = spec.n_expert, spec.n_ff_exp
    out = [(f"{p}.ffn_gate_inp.weight", (e, n), "router"),
           (f"{p}.ffn_gate_exps.weight", (e, f, n), "exps"),
           (f"{p}.ffn_up_exps.weight", (e, f, n), "exps"),
           (f"{p}.ffn_down_exps.weight", (f, e, n), "exps_down")]
    if spec.gpt_oss:
        out += [(f"{p}.ffn_gate_inp.bias", (n,), "bias"),
                (f"{p}.ffn_gate_exps.bias", (f, n), "bias"),
                (f"{p}.ffn_up_exps.bias", (f, n), "bias"),
                (f"{p}.ffn_down_exps.bias", (e, n), "bias")]
    if spec.mla or spec.arch == "glm4moe":
        out.append((f"{p}.exp_probs_b.bias", (n,), "bias"))
    if spec.n_ff_shexp:
        s = spec.n_ff_shexp
        out += [(f"{p}.ffn_gate_shexp.weight", (e, s), "ffn"),
                (f"{p}.ffn_up_shexp.weight", (e, s), "ffn"),
                (f"{p}.ffn_down_shexp.weight", (s, e), "ffn_down")]
    return out


def tensors(spec: Spec, n_vocab: int) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, ggml dims, ggml type) of every tensor, in llama.cpp's conversion order."""
    # tied: llama.cpp quantizes the shared matrix as the output (Q6_K in Q4_K_M)
    rows = [("token_embd.weight", (spec.n_embd, n_vocab), "output" if spec.tied else "embd", 0)]
    for i in range(spec.n_layers + spec.nextn):
        p = f"blk.{i}"
        layer = [(f"{p}.attn_norm.weight", (spec.n_embd,), "norm"), *_attention(spec, p),
                 (f"{p}.ffn_norm.weight" if not spec.gpt_oss else f"{p}.post_attention_norm.weight",
                  (spec.n_embd,), "norm"), *_ffn(spec, p, i)]
        if i >= spec.n_layers:  # multi-token prediction: its own projection and norms
            layer += [(f"{p}.nextn.eh_proj.weight", (2 * spec.n_embd, spec.n_embd), "attn"),
                      (f"{p}.nextn.enorm.weight", (spec.n_embd,), "norm"),
                      (f"{p}.nextn.hnorm.weight", (spec.n_embd,), "norm"),
                      (f"{p}.nextn.shared_head_norm.weight", (spec.n_embd,), "norm")]
        rows += [(name, dims, role, i) for name, dims, role in layer]
    rows.append(("output_norm.weight", (spec.n_embd,), "norm", 0))
    if not spec.tied:
        rows.append(("output.weight", (spec.n_embd, n_vocab), "output", 0))
    return [(name, dims, _quant(spec, role, i, dims[0])) for name, dims, role, i in rows]


def _metadata(writer, spec: Spec) -> None:
    a = spec.arch
    writer.add_name(spec.name)
    for key, value in {
        "block_count": spec.n_layers + spec.nextn, "context_length": spec.ctx,
        "embedding_length": spec.n_embd, "feed_forward_length": spec.n_ff,
        "attention.head_count": spec.n_head, "attention.head_count_kv": spec.n_head_kv,
        "attention.key_length": spec.head_dim, "attention.value_length": spec.head_dim,
        "expert_count": spec.n_expert, "expert_used_count": spec.n_expert_used,
        "expert_feed_forward_length": spec.n_ff_exp,
        "expert_shared_feed_forward_length": spec.n_ff_shexp,
        "expert_shared_count": int(bool(spec.n_ff_shexp)),
        "leading_dense_block_count": spec.dense_first,
        "interleave_moe_layer_step": spec.moe_step, "nextn_predict_layers": spec.nextn,
        "sliding_window": 128 if spec.gpt_oss else 0,
    }.items():
        if value or key in ("block_count",):
            writer.add_uint32(f"{a}.{key}", int(value))
    writer.add_float32(f"{a}.attention.layer_norm_rms_epsilon", 1e-6)
    writer.add_float32(f"{a}.rope.freq_base", 1e6)
    if a == "qwen3moe" or a == "llama4":
        writer.add_uint32(f"{a}.rope.dimension_count", spec.head_dim)


def _tokenizer(writer, spec: Spec, donor: Path | None) -> int:
    """The donor's tokenizer (a runnable file), padded with tokens no text tokenizes to
    (ordinary ones: random weights generate them, and they must stream as text) up to the
    shape's vocabulary, so that the embedding and output matrices, which every token
    reads, have the real model's size; none in a header-only file (the planner reads the vocabulary
    size from the token embeddings). Returns the vocabulary size."""
    if donor is None:
        return spec.n_vocab

    reader = open_gguf(donor)
    n_own = len(reader.fields["tokenizer.ggml.tokens"].data)
    pad = max(spec.n_vocab - n_own, 0)
    padding = {"tokenizer.ggml.tokens": [f"<pad{i}>" for i in range(pad)],
               "tokenizer.ggml.token_type": [NORMAL_TOKEN] * pad,
               "tokenizer.ggml.scores": [0.0] * pad}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer."):
            value = field.contents()
            value = value + padding[key] if key in padding else value
            sub = field.types[-1] if len(field.types) > 1 else None
            writer.add_key_value(key, value, field.types[0], sub)
    return n_own + pad


def write_header_only(spec: Spec, path: Path, donor: Path | None = None) -> Path:
    """The model's GGUF with its data region left a sparse hole of the right size."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    writer = gguf.GGUFWriter(str(path), spec.arch)
    _metadata(writer, spec)
    n_vocab = _tokenizer(writer, spec, donor)
    data = 0
    for name, dims, kind in tensors(spec, n_vocab):
        qtype = gguf.GGMLQuantizationType[kind]
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        nbytes = int(np.prod(dims)) // block * size
        writer.add_tensor_info(name, tuple(reversed(dims)), np.float32, nbytes, qtype)
        data += gguf.GGUFWriter.ggml_pad(nbytes, writer.data_alignment)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.write_padding(writer.fout[0], writer.fout[0].tell())
    start = writer.fout[0].tell()
    writer.close()
    os.truncate(path, start + data)
    return path


# Scale fields of each block type (offset, kind), set to small finite values so random
# quants decode to weights of a few hundredths: random bytes there could be NaN or huge.
_SCALES = {"Q8_0": [(0, "f16")], "Q5_0": [(0, "f16")], "Q4_0": [(0, "f16")],
           "Q4_K": [(0, "f16"), (2, "f16")], "Q5_K": [(0, "f16"), (2, "f16")],
           "Q6_K": [(208, "f16")], "MXFP4": [(0, "e8m0")]}
_SCALE_VALUE = {"f16": np.float16(2 ** -12).tobytes(), "e8m0": bytes([120])}


def _random_block_bytes(rng, kind: str, count: int, dims: tuple) -> bytes:
    import gguf

    if kind in ("F32", "F16", "BF16"):
        n = int(np.prod(dims))
        values = np.ones(n, np.float32) if len(dims) == 1 else \
            rng.standard_normal(n, np.float32) * 0.02
        if kind == "F32":
            return values.tobytes()
        if kind == "F16":
            return values.astype(np.float16).tobytes()
        return (values.view(np.uint32) >> 16).astype(np.uint16).tobytes()
    _, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    blocks = rng.integers(0, 256, (count, size), dtype=np.uint8)
    for offset, scale in _SCALES[kind]:
        value = np.frombuffer(_SCALE_VALUE[scale], np.uint8)
        blocks[:, offset:offset + len(value)] = value
    return blocks.tobytes()


def fill_random(path: Path, seed: int = 0) -> Path:
    """Random valid blocks into every tensor of a header-only file, in place."""
    import gguf

    rng = np.random.default_rng(seed)
    reader = open_gguf(path)
    with path.open("r+b") as handle:
        for tensor in reader.tensors:
            kind = tensor.tensor_type.name
            block, _ = gguf.GGML_QUANT_SIZES[tensor.tensor_type]
            dims = tuple(int(d) for d in tensor.shape)
            handle.seek(int(tensor.data_offset))
            if kind in ("F32", "F16", "BF16"):
                handle.write(_random_block_bytes(rng, kind, 0, dims))
                continue
            rows, per_row = int(np.prod(dims[1:])), dims[0] // block
            for first in range(0, rows, 4096):  # a matrix at a time would take GBs
                n = min(4096, rows - first)
                handle.write(_random_block_bytes(rng, kind, n * per_row, dims))
    return path


def write_random(spec: Spec, path: Path, donor: Path) -> Path:
    return fill_random(write_header_only(spec, path, donor))


def cached(spec: Spec, donor: Path | None = None) -> Path:
    """The shape's file under .cache/shapes, written once: header-only without a donor,
    runnable (random weights, the donor's tokenizer) with one."""
    kind = "random" if donor else "header"
    path = CACHE / f"{spec.name}-{spec.mix}-{kind}-v{LAYOUT}.gguf"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        (write_random(spec, tmp, donor) if donor else write_header_only(spec, tmp))
        os.replace(tmp, path)
    return path

