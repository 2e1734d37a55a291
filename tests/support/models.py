"""The models tests run: the starters by name and Hub repository, and copies of a GGUF
file changed in one known way."""

from __future__ import annotations

import shutil
from pathlib import Path

from engine.catalog.gguf_file import open_gguf

STARTER = "smollm2-135m-instruct-q4_1"
SMOL = "HuggingFaceTB/SmolLM2-135M-Instruct-GGUF"
GEMMA_REPO = "unsloth/gemma-3-270m-it-GGUF"
GEMMA = "gemma-3-270m-q4_k_m"
# A question the starter answers "The capital of France is Paris." at every greedy step
# clear of the runner-up by 0.95 logits or more (measured with and without the default
# system prompt). The bare "What is the capital of France?" opens at a near tie ("The"
# 23.90, "La" 23.77, "Le" 23.75): on a CI machine a cached prompt's rounding made it French.
PARIS_QUESTION = "What is the capital of France? Answer in one sentence."
ADAPTER = "smol-persona"  # a LoRA adapter for the starter (conftest.py's lora_server)


def linked_models(home: Path, starters_dir: Path, *others: Path) -> Path:
    """`home`'s models folder (data/models, made), holding links to the starters and to
    `others` (a model file each, by its name)."""
    models = home / "data" / "models"
    models.mkdir(parents=True, exist_ok=True)
    for path in (*starters_dir.iterdir(), *others):
        (models / path.name).symlink_to(path)
    return models


def with_template(source: Path, target: Path, template: str,
                  rename: dict[int, str] | None = None) -> Path:
    """A copy of a GGUF model with another chat template in its metadata; `rename` gives
    tokens new texts (a starter's unused control tokens made another format's markers,
    so the copy holds them as control tokens, as the real model's vocabulary does)."""
    from gguf import GGUFValueType, GGUFWriter
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = open_gguf(source)
    writer = GGUFWriter(str(target), arch=reader.fields["general.architecture"].contents())
    metadata = {"tokenizer.chat_template": MetadataDetails(GGUFValueType.STRING, template)}
    if rename:
        tokens = list(reader.fields["tokenizer.ggml.tokens"].contents())
        for token, text in rename.items():
            tokens[token] = text
        metadata["tokenizer.ggml.tokens"] = MetadataDetails(
            GGUFValueType.ARRAY, tokens, sub_type=GGUFValueType.STRING)
    copy_with_new_metadata(reader, writer, metadata, [])
    return target


def with_flat_output(source: Path, target: Path) -> Path:
    """A copy of a GGUF model whose output projection is all zeros: every logit is 0, so
    each next token has probability 1/n_vocab (the least confident model there is). With
    tied embeddings the token embeddings are that projection."""

    tensors = {t.name: t for t in open_gguf(source).tensors}
    tensor = tensors.get("output.weight") or tensors["token_embd.weight"]
    shutil.copy(source, target)
    with target.open("r+b") as handle:
        handle.seek(tensor.data_offset)
        handle.write(bytes(tensor.n_bytes))  # zero scales and quants alike
    return target



def with_nan_rows(source: Path, target: Path, tensor_name: str,
                  tokens: tuple[str, ...] | None = None) -> Path:
    """A copy of a GGUF model with NaN in a matrix: all of it, or the rows of the named
    tokens (an embedding or output matrix has a row per token). Bytes of 0xFF are NaN in
    F32 and F16 alike, and in a quantized block they make its scale NaN."""
    reader = open_gguf(source)
    tensor = next(t for t in reader.tensors if t.name == tensor_name)
    n_rows = int(tensor.shape[-1])
    row_bytes = int(tensor.n_bytes) // n_rows
    if tokens is None:
        spans = [(0, int(tensor.n_bytes))]
    else:
        vocab = list(reader.fields["tokenizer.ggml.tokens"].contents())
        spans = [(vocab.index(token) * row_bytes, row_bytes) for token in tokens]
    shutil.copy(source, target)
    with target.open("r+b") as handle:
        for offset, length in spans:
            handle.seek(int(tensor.data_offset) + offset)
            handle.write(b"\xff" * length)
    return target
