"""Tokens and text: a model's tokenizer, with or without its weights; a long chat prompt
tokenized a turn at a time (TurnTokens)."""

from __future__ import annotations

import ctypes
import sys
from array import array
from pathlib import Path

import llama_cpp as llama

from ..errors import InvalidRequest, ModelLoadFailed
from ..kept import Kept
from .backend import ensure_backend


def _tokenize(vocab, text: str, add_special: bool, parse_special: bool) -> list[int]:
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError as exc:  # the API refuses these where they arrive: a guard
        raise InvalidRequest(f"the text holds a lone surrogate at character {exc.start}, "
                             "which is not Unicode text", param="messages") from None
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


SEGMENTED_FROM = 8192  # characters: a shorter text is tokenized whole
HELD_BYTES = 32 << 20  # what TurnTokens keeps at most: the turns' texts and their tokens
HELD_PIECE = 4 << 20  # a turn larger than this is tokenized each time, never kept
_SEGMENTABLE = (llama.LLAMA_VOCAB_TYPE_BPE, llama.LLAMA_VOCAB_TYPE_SPM)
_SPECIAL = llama.LLAMA_TOKEN_ATTR_CONTROL | llama.LLAMA_TOKEN_ATTR_USER_DEFINED


class TurnTokens:
    """A chat prompt's tokens, a turn at a time. llama.cpp cuts a text at its special
    tokens first and tokenizes the plain text between them each on its own
    (llama-vocab.cpp: tokenizer_st_partition, then one session per fragment; SPM's space
    prefix follows any special token), so cut before the special token that opens each
    turn, the pieces' tokens end to end are the whole's. A coding agent resends 50 KB of
    tools and instructions every turn (16 ms to tokenize on 2 cores, a third of a cached
    turn's time to first token): only turns not seen lately are tokenized.

    A marker is trusted only where the cut is exact for every text, not just the first
    one seen: no other special token may contain or overlap it (llama.cpp matches the
    longer first: Gemma's user-defined "\n" inside its "\n\n" once made every later
    prompt with paragraphs tokenize apart), and its first use is checked against the
    whole text's tokens. What is kept is bounded in bytes (HELD_BYTES), texts and tokens."""

    def __init__(self, vocab):
        self.vocab = vocab
        self.held: Kept[array] = Kept(HELD_BYTES, HELD_PIECE)
        self._markers: dict[str, bool] = {}  # marker -> whether cutting there is exact
        self._specials: list[str] | None = None  # every special token's text, once
        self.segmentable = llama.llama_vocab_type(vocab) in _SEGMENTABLE

    def tokenize(self, text: str) -> list[int]:
        marker = self._marker(text) if self.segmentable else None
        if marker is None:
            return _tokenize(self.vocab, text, False, True)
        parts = text.split(marker)
        pieces = ([parts[0]] if parts[0] else []) + [marker + p for p in parts[1:]]
        tokens = [t for piece in pieces for t in self._piece(piece)]
        if marker not in self._markers:  # its first use: the whole, to compare
            whole = _tokenize(self.vocab, text, False, True)
            self._markers[marker] = whole == tokens
            return whole
        return tokens

    def _marker(self, text: str) -> str | None:
        """The special token the text's turns open with: of those in its first few hundred
        characters (no left-stripping one: it would eat the piece before; none another
        special token contains or overlaps), the most frequent, if it recurs."""
        found = {}
        for token in _tokenize(self.vocab, text[:512], False, True):
            attr = llama.llama_vocab_get_attr(self.vocab, token)
            if attr & _SPECIAL and not attr & llama.LLAMA_TOKEN_ATTR_LSTRIP:
                mark = piece_of(self.vocab, token, True).decode("utf-8", "replace")
                if mark and mark not in found and self._trusted(mark):
                    found[mark] = text.count(mark)
        best = max(found, key=found.get, default=None)
        return best if best is not None and found[best] >= 2 else None

    def _trusted(self, mark: str) -> bool:
        if mark not in self._markers and not self._alone(mark):
            self._markers[mark] = False
        return self._markers.get(mark, True)

    def _alone(self, mark: str) -> bool:
        """No other special token holds `mark` or overlaps it at either end."""
        if self._specials is None:
            self._specials = _special_texts(self.vocab)
        for other in self._specials:
            if other == mark:
                continue
            if mark in other or any(other.endswith(mark[:k]) or other.startswith(mark[-k:])
                                    for k in range(1, min(len(mark), len(other) + 1))):
                return False
        return True

    def _piece(self, piece: str) -> array:
        tokens = self.held.get(piece)
        if tokens is None:
            tokens = array("i", _tokenize(self.vocab, piece, False, True))
            self.held.put(piece, tokens, sys.getsizeof(piece) + tokens.itemsize * len(tokens))
        return tokens


def _special_texts(vocab) -> list[str]:
    """The text of every control or user-defined token of the vocabulary."""
    out = []
    for token in range(llama.llama_vocab_n_tokens(vocab)):
        if llama.llama_vocab_get_attr(vocab, token) & _SPECIAL:
            text = piece_of(vocab, token, True).decode("utf-8", "replace")
            if text:
                out.append(text)
    return out


class Tokens:
    """Tokenizer calls on `self.vocab` (a llama_vocab), shared by a model file's
    vocabulary alone and a loaded model."""
    vocab = None
    _turns: TurnTokens | None = None

    def tokenize(self, text: str, *, add_special: bool = False,
                 parse_special: bool = False) -> list[int]:
        if parse_special and not add_special and len(text) >= SEGMENTED_FROM:
            if self._turns is None:
                self._turns = TurnTokens(self.vocab)
            return self._turns.tokenize(text)
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
