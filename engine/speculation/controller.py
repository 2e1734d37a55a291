"""How much to speculate, from measurements: the controller adapts the draft length and
turns speculation off for a pair and workload where it measures slower than plain
decoding, retrying later. Also a request's figures (SpecStats) and what it speculates
with (Speculation)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..events import MAX_OUTPUTS

TIE_MARGIN = 0.1  # logits: the least tie margin (see verify.verify and verify.tie_margin)


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
    tie_margin: float = TIE_MARGIN  # see verify.verify()

    def report(self) -> dict:
        """The request's speculation figures (its Usage carries them); the controller's
        note is told once."""
        report = {**self.stats.as_dict(self.controller), "tie_margin": round(self.tie_margin, 3),
                  "note": self.controller.note}
        self.controller.note = None
        return report
