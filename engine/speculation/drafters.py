"""Who proposes tokens: a small model with the same tokenizer (its KV cache follows the
accepted text incrementally), or prompt lookup (continue an earlier occurrence of the
latest n-gram)."""

from __future__ import annotations

import numpy as np

from ..llama.runtime import LlamaModel

MIN_OBSERVED = 64  # emitted tokens before judging a cut draft's coverage


class ModelDrafter:
    """A draft model whose KV cache (sequence 0) follows the text incrementally.

    A draft whose output layer was cut (cut_draft.py) has `head`: the token id of each
    of its output rows."""

    def __init__(self, llama: LlamaModel, model_id: str, min_prob: float = 0.25,
                 device: str = "CPU", head: np.ndarray | None = None):
        self.llama, self.model_id, self.min_prob, self.device = llama, model_id, min_prob, device
        self.head = head
        self.tokens: list[int] = []  # what its KV memory holds
        self._work = np.empty(llama.n_vocab, dtype=np.float32)
        self._kept = None if head is None else np.isin(np.arange(head.max() + 1), head)
        self.observed = self.outside = 0  # emitted tokens, and those it could not propose

    def observe(self, emitted: list[int]) -> None:
        """Count the emitted tokens a cut draft cannot propose: text in a language its
        kept tokens do not cover makes it guess wrong at every such token."""
        if self._kept is not None:
            self.observed += len(emitted)
            self.outside += sum(t >= len(self._kept) or not self._kept[t] for t in emitted)

    def outside_share(self) -> float:
        return self.outside / self.observed if self.observed >= MIN_OBSERVED else 0.0

    @property
    def vocab(self) -> int:
        return self.llama.n_vocab

    def follow(self, context: list[int]) -> None:
        """Catch up with a new prompt (outside the timed rounds)."""
        self._sync(context)

    def propose(self, context: list[int], k: int) -> list[int]:
        """Up to k greedy guesses following `context`, stopping at an unsure one."""
        self._sync(context)
        drafts: list[int] = []
        while len(drafts) < k:
            token, prob = self._best()
            if prob < self.min_prob:
                break
            drafts.append(token)
            if len(drafts) < k:
                self.llama.decode([token], len(self.tokens))
                self.tokens.append(token)
        return drafts

    def _sync(self, context: list[int]) -> None:
        """Bring the draft's KV to exactly `context`, evaluating only what it lacks."""
        self.llama.sync(self.tokens, context)

    def _best(self) -> tuple[int, float]:
        logits = self.llama.logits()
        row = int(logits.argmax())
        np.subtract(logits, logits[row], out=self._work)
        np.exp(self._work, out=self._work)
        token = row if self.head is None else int(self.head[row])
        return token, float(1.0 / self._work.sum())

    def close(self) -> None:
        self.llama.close()


class LookupDrafter:
    """Prompt lookup: propose what followed the latest earlier occurrence of the last
    n tokens (n = 3, 2, 1). Free to run; pays off on text that repeats its context."""

    model_id = device = vocab = None  # no model
    ngram = (3, 2, 1)

    def __init__(self):
        self._context: list[int] = []
        self._last_seen: dict[tuple[int, ...], int] = {}  # n-gram -> position after it

    def follow(self, context: list[int]) -> None:
        self._index(context)

    def observe(self, emitted: list[int]) -> None:
        pass

    def propose(self, context: list[int], k: int) -> list[int]:
        self._index(context)
        for n in self.ngram:
            position = self._last_seen.get(tuple(context[-n:])) if len(context) > n else None
            if position is not None:
                return context[position:position + k]
        return []

    def _index(self, context: list[int]) -> None:
        if context[:len(self._context)] != self._context:  # a new text: start over
            self._context, self._last_seen = [], {}
        start = len(self._context)
        # Index n-grams that end before the final token, so a match has a continuation.
        for end in range(max(start, 1), len(context)):
            for n in self.ngram:
                if end >= n:
                    self._last_seen[tuple(context[end - n:end])] = end
        self._context = list(context)

    def close(self) -> None:
        pass


