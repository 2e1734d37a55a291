"""Tiny random llama-architecture GGUF models for fast engine tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFWriter

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
WORDS = ["▁the", "▁a", "▁cat", "▁dog", "▁is", "▁on", "▁mat", "▁hello", "▁world", "▁Paris"]


def _vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [2, 3, 3, 3, 3]  # unknown, control...
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256  # byte tokens
    tokens += WORDS + [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["▁"]
    types += [1] * (len(tokens) - len(types))
    scores = [0.0] * 261 + [-float(i) for i in range(len(tokens) - 261)]
    return tokens, scores, types


def write_tiny_model(path: Path, *, n_layer: int = 2, n_embd: int = 64, n_ctx: int = 512,
                     seed: int = 0, chat_template: str | None = CHATML) -> Path:
    rng = np.random.default_rng(seed)
    tokens, scores, types = _vocab()
    n_vocab, n_head, n_head_kv, n_ff = len(tokens), 4, 2, 128
    head_dim = n_embd // n_head
    writer = GGUFWriter(str(path), "llama")
    writer.add_name("tiny-random")
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

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    writer.add_tensor("token_embd.weight", weight(n_vocab, n_embd))
    writer.add_tensor("output_norm.weight", np.ones(n_embd, dtype=np.float32))
    writer.add_tensor("output.weight", weight(n_vocab, n_embd))
    kv = n_head_kv * head_dim
    for i in range(n_layer):
        block = f"blk.{i}"
        writer.add_tensor(f"{block}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{block}.attn_q.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"{block}.attn_k.weight", weight(kv, n_embd))
        writer.add_tensor(f"{block}.attn_v.weight", weight(kv, n_embd))
        writer.add_tensor(f"{block}.attn_output.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"{block}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"{block}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"{block}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"{block}.ffn_down.weight", weight(n_embd, n_ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
