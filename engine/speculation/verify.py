"""One speculative round: the drafter proposes, the main model checks every proposal in
one batch, and the agreeing prefix is kept.

Exactness: at each checked position the main model's own sampler picks a token from
the main model's distribution given the accepted prefix; a draft token is kept only when
it equals that pick, and the first pick that differs is emitted in its place. So every
emitted token is what plain decoding would sample (greedy: identical output).
"""

from __future__ import annotations

import time

import numpy as np

from ..llama.runtime import LlamaModel
from ..prefix import common_prefix
from ..llama.sampler import Sampler
from .controller import TIE_MARGIN, Speculation

# A flip needs the best two logits to move apart by more than their margin: at most twice
# the largest move of one of them, measured on one sentence; a quarter more for other text.
GAP_SAFETY = 2.5
GAP_CANDIDATES = 16  # the logits that can matter: the single-token evaluation's best ones
GAP_SAMPLE = "The quick brown fox jumps over the lazy dog, 1 2 3 4 5 6 7 8 9 10 times."



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
