"""Speculative decoding: a drafter proposes tokens, the main model checks them all in one
batch and keeps those it agrees with.

Exactness: at each checked position the main model's own sampler picks a token from
the main model's distribution given the accepted prefix; a draft token is kept only when
it equals that pick, and the first pick that differs is emitted in its place. So every
emitted token is what plain decoding would sample (greedy: identical output).

Drafters: a small model with the same tokenizer (its KV cache follows the accepted text
incrementally) or prompt lookup (continue an earlier occurrence of the latest n-gram).
The controller adapts the draft length and turns speculation off for a pair and
workload where it measures slower than plain decoding, retrying later.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .llama_runtime import LlamaModel, Sampler
from .planner import MAX_OUTPUTS
from .prompt_cache import common_prefix

TIE_MARGIN = 0.1  # logits: the least tie margin (see verify and tie_margin)
# A flip needs the best two logits to move apart by more than their margin: at most twice
# the largest move of one of them, measured on one sentence; a quarter more for other text.
GAP_SAFETY = 2.5
GAP_CANDIDATES = 16  # the logits that can matter: the single-token evaluation's best ones
GAP_SAMPLE = "The quick brown fox jumps over the lazy dog, 1 2 3 4 5 6 7 8 9 10 times."
MIN_OBSERVED = 64  # emitted tokens before judging a cut draft's coverage


@dataclass
class SpecStats:
    """One request's figures."""
    mode: str
    model: str | None = None
    device: str | None = None  # where the draft model runs
    vocab: int | None = None   # how many tokens the draft can propose
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0

    def as_dict(self, controller: "SpecController") -> dict:
        return {"mode": self.mode, "draft_model": self.model, "draft_device": self.device,
                "draft_vocab": self.vocab,
                "drafted": self.drafted, "accepted": self.accepted,
                "acceptance": round(self.accepted / self.drafted, 3) if self.drafted else None,
                "speedup": controller.speedup(), "enabled": controller.enabled,
                "draft_length": controller.k}


class ModelDrafter:
    """A draft model whose KV cache (sequence 0) follows the text incrementally.

    A draft whose output layer was cut (draft_head.py) has `head`: the token id of each
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


@dataclass
class SpecController:
    """Draft length and on/off for one (main model, drafter) pair, from measurements.

    The draft length maximises expected tokens per second: with acceptance rate a, k
    drafts yield (1 - a^(k+1)) / (1 - a) tokens and cost k draft steps plus one
    verification (about a plain step, a little more per extra position); the draft
    step's and the plain step's times are measured. Speculation turns off when
    its measured rate falls below `min_speedup` of plain decoding's after enough rounds
    and again against a freshly timed baseline, and is tried again a few requests later."""
    k: int = 6
    k_max: int = min(16, MAX_OUTPUTS - 1)
    acceptance: float = 0.8          # running rate, per drafted token
    min_speedup: float = 0.95
    min_rounds: int = 10             # evidence needed before turning off
    probe_tokens: int = 12           # plain tokens timed to know the baseline
    retry_after_requests: int = 4
    plain_tps: float | None = None
    spec_tps: float | None = None
    draft_s: float | None = None     # seconds per drafted token
    verify_extra: float = 0.05       # a verification's cost per extra position, in plain steps
    enabled: bool = True
    requests_off: int = 0
    spec_rounds: int = 0
    note: str | None = None
    confirming: bool = False  # the baseline is being re-timed before turning off
    _plain: list[float] = field(default_factory=list)

    def start_request(self) -> None:
        if not self.enabled:
            self.requests_off += 1
            if self.requests_off > self.retry_after_requests:  # the workload may differ now
                self.enabled, self.spec_tps, self.spec_rounds = True, None, 0
                self.plain_tps, self.confirming = None, False
                self.note = "speculation re-enabled for a new trial"

    def wants_plain(self) -> bool:
        """True while the plain baseline still needs timing, or speculation is off."""
        return not self.enabled or self.plain_tps is None

    def record_plain(self, seconds: float) -> None:
        self._plain.append(seconds)
        if len(self._plain) >= self.probe_tokens:
            rate = len(self._plain) / sum(self._plain)
            self.plain_tps = rate if self.plain_tps is None else 0.5 * self.plain_tps + 0.5 * rate
            self._plain.clear()

    def record_round(self, proposed: int, accepted: int, emitted: int, seconds: float,
                     draft_seconds: float) -> None:
        rate = emitted / seconds
        self.spec_tps = rate if self.spec_tps is None else 0.9 * self.spec_tps + 0.1 * rate
        self.spec_rounds += 1
        self.acceptance = 0.8 * self.acceptance + 0.2 * (accepted / proposed)
        per_draft = draft_seconds / proposed
        self.draft_s = per_draft if self.draft_s is None else 0.8 * self.draft_s + 0.2 * per_draft
        if self.plain_tps:  # what each extra verified position costs, in plain steps
            extra = ((seconds - draft_seconds) * self.plain_tps - 1) / proposed
            self.verify_extra = 0.8 * self.verify_extra + 0.2 * min(max(extra, 0.0), 1.0)
        self.k = self.best_k()
        if self.spec_rounds < self.min_rounds or self.plain_tps is None:
            return
        if self.speedup() >= self.min_speedup:
            self.confirming = False
        elif not self.confirming:
            # This machine's speed drifts: before turning off, time plain decoding again
            # (wants_plain() is true until it is) and judge a few rounds against that.
            self.plain_tps, self.confirming = None, True
            self.spec_rounds = self.min_rounds - 3
        else:
            self.enabled, self.requests_off, self.confirming = False, 0, False
            self.note = (f"speculation turned off: {self.speedup():.2f}x of plain decoding "
                         "for this pair and workload")

    def best_k(self) -> int:
        if not self.plain_tps or not self.draft_s:
            return self.k
        a, plain_s = min(self.acceptance, 0.999), 1 / self.plain_tps

        def tokens_per_second(k: int) -> float:
            cost = k * self.draft_s + plain_s * (1 + self.verify_extra * k)
            return (1 - a ** (k + 1)) / (1 - a) / cost
        return max(range(2, self.k_max + 1), key=tokens_per_second)

    def speedup(self) -> float | None:
        if self.plain_tps and self.spec_tps is not None:  # 0: rounds emitted nothing
            return round(self.spec_tps / self.plain_tps, 3)
        return None


@dataclass
class Speculation:
    """What one request speculates with."""
    drafter: object  # ModelDrafter or LookupDrafter
    controller: SpecController
    stats: SpecStats
    tie_margin: float = TIE_MARGIN  # see verify()


def tie_margin(target: LlamaModel, tokens: list[int], seq_id: int, k: int = 8) -> float:
    """How close two logits must be for verification to leave a position to a lone
    evaluation, for this model on this machine: GAP_SAFETY times the largest difference
    between llama.cpp's batched and single-token logits of the best candidates for the
    same k tokens. Here (AVX-512): F32, F16, Q8_0, Q4_0 and Q4_1 stay at TIE_MARGIN (gaps
    of 0 to 0.03); K-quant mixes (Q4_K_M) have gaps near 1 logit, in SmolLM2 and Gemma 3
    alike. The tokens are evaluated after the sequence's `tokens` and forgotten again."""
    sample = target.tokenize(GAP_SAMPLE, add_special=False, parse_special=False)[:2 * k]
    start = len(tokens)
    if len(sample) < 2 or start + len(sample) > target.n_ctx:
        return TIE_MARGIN
    half = len(sample) // 2
    target.decode(sample[:half], start, seq_id)
    target.decode(sample[half:], start + half, seq_id, all_logits=True)
    batched = [target.logits(i).copy() for i in range(len(sample) - half)]
    target.forget(seq_id, start + half)
    gap = 0.0
    for i, token in enumerate(sample[half:]):
        target.decode([token], start + half + i, seq_id)
        single = target.logits()
        best = np.argpartition(single, -GAP_CANDIDATES)[-GAP_CANDIDATES:]
        gap = max(gap, float(np.abs(single[best] - batched[i][best]).max()))
    target.forget(seq_id, start)
    return max(TIE_MARGIN, GAP_SAFETY * gap)


def near_tie(logits: np.ndarray, margin: float) -> bool:
    """True when another token's logit is within `margin` of the best one."""
    return np.count_nonzero(logits > logits.max() - margin) > 1


def verify(target: LlamaModel, tokens: list[int], last: int, drafts: list[int],
           sampler: Sampler, seq_id: int, margin: float = TIE_MARGIN) -> list[int]:
    """One verification pass. `tokens` are those in the target's KV; `last` was sampled
    but not yet evaluated. Returns the accepted drafts followed by the target's own pick
    (a correction, or a bonus when all drafts were kept); `tokens` is updated to what
    the KV then holds: `last` and every returned token but the final one, which becomes
    the new `last`.

    Greedy exactness: llama.cpp's batched kernels sum in another order than its
    single-token ones (and repacked weights may take other kernels for a batch), which
    could flip a near tie. A position whose best two logits are within `margin` (see
    tie_margin) is left to a lone evaluation, as plain decoding does it: the round stops
    before it (and may return nothing)."""
    start = len(tokens)
    target.decode([last, *drafts], start, seq_id, all_logits=True)
    emitted: list[int] = []
    for i, draft in enumerate([*drafts, None]):
        if sampler.greedy and near_tie(target.logits(i), margin):
            break
        pick = sampler.sample(target, i)
        emitted.append(pick)
        if pick != draft:
            break
    if emitted:
        tokens.append(last)
        tokens.extend(emitted[:-1])
    target.forget(seq_id, len(tokens))  # roll back the rejected positions
    return emitted


def speculative_step(target: LlamaModel, tokens: list[int], last: int, spec: Speculation,
                     sampler: Sampler, seq_id: int, limit: int) -> list[int]:
    """Draft, verify, measure: one round. Returns the tokens to emit; none when the
    very next token must be decided by a plain step."""
    drafter, controller, stats = spec.drafter, spec.controller, spec.stats
    started = time.perf_counter()
    drafts = drafter.propose([*tokens, last], min(controller.k, limit - 1))
    drafted = time.perf_counter()
    emitted = verify(target, tokens, last, drafts, sampler, seq_id, spec.tie_margin)
    accepted = common_prefix(emitted, drafts)
    drafter.observe(emitted)
    stats.drafted += len(drafts)
    stats.accepted += accepted
    stats.rounds += 1
    if drafts:
        controller.record_round(len(drafts), accepted, len(emitted),
                                time.perf_counter() - started, drafted - started)
    return emitted
