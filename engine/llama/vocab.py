"""Tokens and text: a model's tokenizer, with or without its weights."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp as llama

from ..errors import ModelLoadFailed
from .backend import ensure_backend


def _tokenize(vocab, text: str, add_special: bool, parse_special: bool) -> list[int]:
    data = text.encode("utf-8")
    capacity = len(data) + 8
    buf = (llama.llama_token * capacity)()
    n = llama.llama_tokenize(vocab, data, len(data), buf, capacity, add_special, parse_special)
    if n < 0:
        capacity = -n
        buf = (llama.llama_token * capacity)()
        n = llama.llama_tokenize(vocab, data, len(data), buf, capacity, add_special,
                                 parse_special)
    return list(buf[:n])


def piece_of(vocab, token: int, special: bool = False) -> bytes:
    """The token's text; a control token's only when `special` (else nothing)."""
    buf = ctypes.create_string_buffer(64)
    n = llama.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama.llama_token_to_piece(vocab, token, buf, len(buf), 0, special)
    return buf.raw[:n]


class Tokens:
    """Tokenizer calls on `self.vocab` (a llama_vocab), shared by a model file's
    vocabulary alone and a loaded model."""
    vocab = None

    def tokenize(self, text: str, *, add_special: bool = False,
                 parse_special: bool = False) -> list[int]:
        return _tokenize(self.vocab, text, add_special, parse_special)

    def is_end_of_generation(self, token: int) -> bool:
        return llama.llama_vocab_is_eog(self.vocab, token)

    @property
    def add_bos(self) -> bool:
        return llama.llama_vocab_get_add_bos(self.vocab)

    @property
    def bos(self) -> int:
        return llama.llama_vocab_bos(self.vocab)


class Vocabulary(Tokens):
    """A model file's tokenizer alone (no weights, no context): safe to use on a
    thread of its own."""

    def __init__(self, path: Path):
        ensure_backend()
        mparams = llama.llama_model_default_params()
        mparams.vocab_only = True
        self.model = llama.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            raise ModelLoadFailed(f"llama.cpp could not read the vocabulary of {path.name}")
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.n_vocab = llama.llama_vocab_n_tokens(self.vocab)

    def piece(self, token: int, special: bool = False) -> bytes:
        return piece_of(self.vocab, token, special)

    def close(self) -> None:
        llama.llama_model_free(self.model)
