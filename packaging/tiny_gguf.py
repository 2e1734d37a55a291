"""Tiny random llama-architecture GGUF models, written with the `gguf` package.

Used by the build smoke test (packaging/llama_smoke.py), which checks each weight type
that llama.cpp's CPU backend repacks or accelerates, and by the fast engine tests.
Only numpy and gguf are needed: this runs before the project itself is installed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WORDS = ["▁the", "▁a", "▁cat", "▁dog", "▁is", "▁on", "▁mat", "▁hello", "▁world", "▁Paris"]
#: weight types the smoke test covers: the ones llama.cpp's CPU backend repacks
#: (Q4_0, Q4_K, Q8_0) or runs on AMX tiles (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K), and F16.
WEIGHT_TYPES = ("F32", "F16", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K", "Q8_0")
# Byte offsets of the f16 super-block scales in K-quant blocks (ggml-common.h); the rest
# of a block (sub-scales, quants) can be any bytes.
_K_SCALES = {"Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,)}


def _vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [2, 3, 3, 3, 3]  # unknown, control...
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256  # byte tokens
    tokens += WORDS + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["▁"]
    types += [1] * (len(tokens) - len(types))
    scores = [0.0] * 261 + [-float(i) for i in range(len(tokens) - 261)]
    return tokens, scores, types


def _k_quant(rows: np.ndarray, weight_type: str, rng: np.random.Generator) -> np.ndarray:
    """Random K-quant blocks (the gguf package cannot quantize K-quants): random sub-scales
    and quants under small f16 super-block scales."""
    qtype = GGMLQuantizationType[weight_type]
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    n_blocks = rows.size // block_size
    blocks = rng.integers(0, 256, size=(n_blocks, type_size), dtype=np.uint8)
    scale = np.full((n_blocks, 1), 0.001, dtype=np.float16).view(np.uint8)
    for offset in _K_SCALES[weight_type]:
        blocks[:, offset:offset + 2] = scale
    return blocks.reshape(rows.shape[0], -1)


def _encode(data: np.ndarray, weight_type: str, rng: np.random.Generator):
    """(array, raw_dtype) for the writer: matrices in `weight_type`, norms stay F32."""
    if data.ndim == 1 or weight_type == "F32":
        return data, None
    if weight_type == "F16":
        return data.astype(np.float16), None
    qtype = GGMLQuantizationType[weight_type]
    if weight_type in _K_SCALES:
        return _k_quant(data, weight_type, rng), qtype
    return quantize(data, qtype), qtype


def write_tiny_model(path: Path, *, n_layer: int = 2, n_embd: int = 64, n_ff: int = 128,
                     n_ctx: int = 512, seed: int = 0, weight_type: str = "F32",
                     chat_template: str | None = CHATML) -> Path:
    """A random model; quantized types need n_embd and n_ff multiples of 256 (K-quants)
    or 32."""
    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocab()
    n_vocab, n_head, n_head_kv = len(tokens), 4, 2
    head_dim = n_embd // n_head
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("tiny-random" if weight_type == "F32" else f"tiny-random-{weight_type.lower()}")
    writer.add_block_count(n_layer)
    writer.add_context_length(n_ctx)
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    if chat_template:
        writer.add_chat_template(chat_template)

    def add(name: str, data: np.ndarray) -> None:
        array, raw_dtype = _encode(data, weight_type, rng)
        writer.add_tensor(name, array, raw_dtype=raw_dtype)

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    add("token_embd.weight", weight(n_vocab, n_embd))
    add("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    add("output.weight", weight(n_vocab, n_embd))
    kv = n_head_kv * head_dim
    for i in range(n_layer):
        block = f"blk.{i}"
        add(f"{block}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        add(f"{block}.attn_q.weight", weight(n_embd, n_embd))
        add(f"{block}.attn_k.weight", weight(kv, n_embd))
        add(f"{block}.attn_v.weight", weight(kv, n_embd))
        add(f"{block}.attn_output.weight", weight(n_embd, n_embd))
        add(f"{block}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        add(f"{block}.ffn_gate.weight", weight(n_ff, n_embd))
        add(f"{block}.ffn_up.weight", weight(n_ff, n_embd))
        add(f"{block}.ffn_down.weight", weight(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
