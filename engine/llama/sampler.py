"""Picking the next token: llama.cpp's sampler chains, greedy argmax and grammars."""

from __future__ import annotations

import ctypes
import secrets
import time
from typing import TYPE_CHECKING

import llama_cpp as llama
import numpy as np

from ..errors import GrammarTooSlow, InvalidRequest
from ..events import SamplingParams

if TYPE_CHECKING:
    from .runtime import LlamaModel

# Greedy decoding breaks near ties by token id. llama.cpp's logits for the same tokens
# differ in the last bits with what else shares a batch and where the KV cells lie (the
# order flash attention sums them in); answers here meet two logits within 0.001 of each
# other about once in 40 tokens, and plain argmax would then follow the rounding.
GREEDY_TIE = 0.01
# A grammar's work for one token, and for a whole answer: a grammar within every static
# bound can still slow down with each token (nested optional repetitions multiply the
# parse stacks), and every request on the model waits behind it. Ordinary grammars take
# milliseconds a token here, a whole vocabulary checked tens of milliseconds.
GRAMMAR_TOKEN_S = 2.0
GRAMMAR_TOTAL_S = 30.0


def greedy_pick(logits: np.ndarray) -> int:
    """The best token; among tokens within GREEDY_TIE of it, the lowest id."""
    best = logits.max()
    return int(np.flatnonzero(logits >= best - GREEDY_TIE)[0])


_TOKEN_DATA = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])  # llama_token_data


class Sampler:
    """A llama.cpp sampler chain built from SamplingParams; greedy at temperature 0.

    Plain greedy decoding skips the chain: an argmax over the logits in place costs a
    fraction of building llama.cpp's candidate array (262k entries for Gemma).

    With a grammar (GBNF) the output must match it. Checking every token of the
    vocabulary against the grammar at every step costs more than the model here (0.18x
    speed on Gemma's 262k tokens), so, as llama.cpp's common sampler does, the chain picks
    first and the grammar checks that one token; only when it is refused is the grammar
    applied to all candidates and the pick made again among those it allows."""

    def __init__(self, params: SamplingParams, n_vocab: int, grammar: str | None = None,
                 vocab=None):
        self.greedy = params.temperature <= 0
        self._penalized = bool(params.frequency_penalty or params.presence_penalty)
        self._argmax = self.greedy and not self._penalized and grammar is None
        self._chain = _chain(params, n_vocab)
        self._grammar, self._vocab = None, vocab
        self._forced: list[int] = []  # tokens to write next whatever the logits say
        self._grammar_s = 0.0  # the grammar's time so far
        if grammar is not None:
            self._grammar = llama.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
            if not self._grammar:
                self.close()
                # the request's grammar, or one made from its schema: its fault
                raise InvalidRequest(f"llama.cpp could not parse the grammar:\n"
                                     f"{grammar[:400]}", param="grammar")
            self._candidates = np.zeros(n_vocab, dtype=_TOKEN_DATA)
            self._ids = np.arange(n_vocab, dtype=np.int32)
            self._one = np.zeros(1, dtype=_TOKEN_DATA)

    def force(self, tokens: list[int]) -> None:
        """Write these tokens next (a reasoning budget's closing marker)."""
        self._forced = list(tokens)

    def sample(self, model: "LlamaModel", index: int = -1) -> int:
        """Sample from the logits at batch output `index` (and accept the token).
        NonFiniteLogits when they hold a NaN or an inf: checked before any sampler, ours
        or llama.cpp's, reads them (an argmax of NaN finds nothing; a chain picks noise)."""
        logits = model.logits(index)
        if self._forced:
            token = self._take_forced()
            if token is not None:
                return token
        if self._argmax:
            return greedy_pick(logits)
        if self._grammar is None:
            return llama.llama_sampler_sample(self._chain, model.ctx, index)
        # the chain's own pick, in C; with penalties (whose history the chain keeps) the
        # pick goes through _pick so that only the kept token is accepted
        token = self._pick(logits, constrained=False) if self._penalized else \
            llama.llama_sampler_sample(self._chain, model.ctx, index)
        started = time.perf_counter()
        if not self._allows(token):  # refused: pick again
            token = self._pick(logits, constrained=True)
        self._accept(token)
        self._spend(time.perf_counter() - started)
        return token

    def _spend(self, seconds: float) -> None:
        """The grammar's time for a token counted against the budget; GrammarTooSlow past
        it (after the token is accepted: the sequence ends there)."""
        self._grammar_s += seconds
        per_token, total = GRAMMAR_TOKEN_S, GRAMMAR_TOTAL_S
        if seconds > per_token or self._grammar_s > total:
            spent = f"{seconds:.1f} s for one token" if seconds > per_token else \
                f"{self._grammar_s:.1f} s in all"
            raise GrammarTooSlow(
                f"the output's grammar took {spent} (at most {per_token:g} s a token and "
                f"{total:g} s an answer): simplify its schema or grammar (nested "
                "repetitions such as ((a{9,99}){9,99}) slow down with every token)",
                param="grammar")

    def _take_forced(self) -> int | None:
        """The next forced token, accepted like a sampled one; None (the rest dropped)
        when the grammar refuses it: a grammar handed a token it refuses aborts llama.cpp."""
        token = self._forced.pop(0)
        if self._grammar is not None and not self._allows(token):
            self._forced = []
            return None
        self._accept(token)
        return token

    def _allows(self, token: int) -> bool:
        """The grammar lets `token` come next."""
        self._one["id"], self._one["logit"] = token, 0.0
        return _apply(self._grammar, self._one).logit != -np.inf

    def _accept(self, token: int) -> None:
        """A token taken outside llama_sampler_sample, made known to the samplers that
        keep history. An end of generation ends the output: the grammar never sees it
        (llama.cpp aborts the process when a grammar that is not complete is handed one,
        as a request's grammar naming such a token, <|call|>, would do)."""
        if self._grammar is not None and not llama.llama_vocab_is_eog(self._vocab, token):
            llama.llama_sampler_accept(self._grammar, token)
        if self._penalized:
            llama.llama_sampler_accept(self._chain, token)

    def _pick(self, logits: np.ndarray, constrained: bool) -> int:
        candidates = self._candidates  # samplers reorder it in place: filled anew each time
        candidates["id"] = self._ids
        candidates["logit"] = logits
        candidates["p"] = 0.0
        if constrained:
            _apply(self._grammar, candidates)
            if np.isneginf(candidates["logit"]).all():  # a dead end (an end-of-generation
                return llama.llama_vocab_eos(self._vocab)  # token named mid-grammar): stop
        return _apply(self._chain, candidates).id

    def close(self) -> None:
        for sampler in (self._chain, self._grammar):
            if sampler:
                llama.llama_sampler_free(sampler)
        self._chain = self._grammar = None


def _chain(params: SamplingParams, n_vocab: int):
    chain = llama.llama_sampler_chain_init(llama.llama_sampler_chain_default_params())
    if params.frequency_penalty or params.presence_penalty:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_penalties(
            n_vocab, 64, 1.0, params.frequency_penalty, params.presence_penalty))
    if params.temperature <= 0:
        llama.llama_sampler_chain_add(chain, llama.llama_sampler_init_greedy())
        return chain
    seed = params.seed if params.seed is not None else secrets.randbits(32)
    for stage in (
        llama.llama_sampler_init_top_k(params.top_k),
        llama.llama_sampler_init_top_p(params.top_p, 1),
        llama.llama_sampler_init_min_p(params.min_p, 1),
        llama.llama_sampler_init_temp(params.temperature),
        llama.llama_sampler_init_dist(seed & 0xFFFFFFFF),
    ):
        llama.llama_sampler_chain_add(chain, stage)
    return chain


def _apply(sampler, candidates: np.ndarray):
    """llama_sampler_apply on candidates held in a numpy array; returns the selected
    candidate (the first when none is selected). Samplers reorder and shrink the array,
    and top-p may point it at a buffer of its own: read the result through the view."""
    view = llama.llama_token_data_array(
        ctypes.cast(candidates.ctypes.data, ctypes.POINTER(llama.llama_token_data)),
        len(candidates), -1, False)
    llama.llama_sampler_apply(sampler, ctypes.byref(view))
    return view.data[max(view.selected, 0)]
