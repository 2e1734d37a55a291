"""One sequence of the shared KV memory and the request it serves.

A slot with a job is active: it is prefilling (its prompt not yet all in its KV memory)
or decoding (`last` was sampled and goes into the next batch). A slot without a job is
idle but resident: its KV cells still hold a finished conversation, so a request that
continues it starts where it ended (see scheduler.py).
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass, field

import numpy as np

from ..events import Delta, Finished, Job, Started, Usage
from ..llama.runtime import LlamaModel
from ..llama.sampler import Sampler
from ..model.loaded import Prompt
from ..speculation.controller import Speculation
from .budget import ReasoningBudget
from .text_stream import TextStream


@dataclass
class Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # what its KV memory holds
    job: Job | None = None
    prompt: list[int] = field(default_factory=list)  # all of it is held before sampling
    sampler: Sampler | None = None
    output: "Output | None" = None
    spec: Speculation | None = None
    last: int | None = None  # sampled, not yet evaluated
    n_cached: int = 0        # prompt tokens found in memory
    admitted: float = 0.0
    used: float = field(default_factory=time.monotonic)  # recency, for eviction
    saved: bool = False      # the prompt cache holds its state
    peers: int = 1           # most sequences in one of its steps
    started: Started | None = None  # emitted with the first token
    adapters: tuple = ()     # the LoRA adapters its cells were computed under (adapter_set)
    client: str | None = None  # the device whose prompts its cells hold (None: the owner's)
    precedence: bool = False   # its request goes before the devices' (the owner's, when chosen)
    held: Prompt | None = None  # the request's prompt, with its images' chunks
    encode_s: float = 0.0    # its images' time in the vision tower (0: kept ones)

    @property
    def active(self) -> bool:
        return self.job is not None

    @property
    def prefilling(self) -> bool:
        return self.job is not None and self.last is None and len(self.tokens) < len(self.prompt)

    @property
    def decoding(self) -> bool:
        return self.job is not None and self.last is not None

    def usage(self) -> Usage:
        """The request's figures so far (its Finished event carries them)."""
        now, output = time.perf_counter(), self.output
        t_first = output.times[0] if output.times else now
        prompt_s = max(t_first - self.admitted, 1e-9)
        decode_s = now - t_first
        n_prompt = len(self.prompt)
        p50, p95 = output.gaps()
        produced = output.produced
        return Usage(
            prompt_tokens=n_prompt, completion_tokens=produced, cached_tokens=self.n_cached,
            queue_s=round(self.admitted - self.job.submitted, 4),
            time_to_first_token_s=round(prompt_s, 4),
            prompt_tokens_per_s=round((n_prompt - self.n_cached) / prompt_s, 2),
            decode_tokens_per_s=round((produced - 1) / decode_s, 2)
            if produced > 1 and decode_s > 0 else 0.0,
            inter_token_p50_s=round(p50, 4), inter_token_p95_s=round(p95, 4),
            shared_streams=self.peers, confidence=output.confidence(),
            images=len(self.images), image_encode_s=round(self.encode_s, 4))

    def pending(self) -> list[int]:
        """The prompt tokens its memory still lacks."""
        return self.prompt[len(self.tokens):]

    @property
    def images(self) -> dict:
        """Its prompt's images by where each starts."""
        return self.held.images if self.held is not None else {}

    def begin(self, job: Job, held: Prompt, sampler: Sampler,
              spec: Speculation | None, output: "Output") -> None:
        """Take a request whose prompt starts with what the memory holds now."""
        self.n_cached, self.held, self.encode_s = len(self.tokens), held, 0.0
        self.job, self.prompt, self.admitted = job, held.tokens, time.perf_counter()
        self.sampler, self.spec, self.output, self.peers = sampler, spec, output, 1

    def end(self) -> None:
        """Back to idle: the request is done, the cells stay."""
        if self.sampler:
            self.sampler.close()
        self.job = self.sampler = self.output = self.spec = self.last = None
        self.started = None
        self.prompt = []
        if self.held is not None:
            self.held.close()
            self.held = None
        self.used = time.monotonic()
        self.saved = False


class Output:
    """Emits one request's tokens as text, times them, and decides when it stops."""

    def __init__(self, job: Job, llama: LlamaModel, turn_ends: tuple[str, ...],
                 turn_end_tokens: frozenset[int], max_tokens: int,
                 shown: frozenset[int] = frozenset(), budget: ReasoningBudget | None = None):
        self.job, self.llama, self.max_tokens = job, llama, max_tokens
        self.turn_end_tokens = turn_end_tokens
        self.shown = shown  # control tokens rendered: the format's reader reads them
        self.budget = budget
        self.forced: list[int] = []  # set by take: tokens the sampler must write next
        self.stream = TextStream(job.request.stop + turn_ends)
        self.produced = 0
        self.reason = "length"
        self.times: list[float] = []  # when each token was taken
        self.logprobs: list[float] = []  # of each sampled token, when the request asks

    def weigh(self, logits: np.ndarray, token: int) -> None:
        """Record the sampled token's log-probability under the model's own distribution
        (an answer's, not its reasoning's: the cascade judges what the user reads)."""
        if self.budget is not None and self.budget.inside:
            return
        top = float(logits.max())
        self.logprobs.append(float(logits[token]) - top
                             - math.log(float(np.exp(logits - top).sum())))

    def confidence(self) -> float | None:
        """Geometric mean probability of the sampled tokens (None when not measured)."""
        if not self.logprobs:
            return None
        return math.exp(sum(self.logprobs) / len(self.logprobs))

    def take(self, token: int) -> bool:
        """Emit a token; False when generation must stop."""
        if self.job.cancelled.is_set():
            self.reason = "cancelled"
            return False
        self.produced += 1
        self.times.append(time.perf_counter())
        if not self.job.request.ignore_eos and (self.llama.is_end_of_generation(token)
                                                or token in self.turn_end_tokens):
            self.reason = "stop"
            return False
        piece = self.llama.piece(token, token in self.shown)
        if self.budget is not None:
            self.forced = self.budget.after(piece.decode("utf-8", "ignore"))
        text = self.stream.feed(piece)
        if text:
            self.job.emit(Delta(text))
        if self.stream.stopped:
            self.reason = "stop"
            return False
        return self.produced < self.max_tokens

    def gaps(self) -> tuple[float, float]:
        """p50 and p95 of the gaps between tokens, in seconds."""
        gaps = [b - a for a, b in zip(self.times, self.times[1:])]
        if len(gaps) < 2:
            return (gaps[0], gaps[0]) if gaps else (0.0, 0.0)
        cuts = statistics.quantiles(gaps, n=20, method="inclusive")
        return statistics.median(gaps), cuts[18]

    def finish(self, usage: Usage) -> None:
        tail = self.stream.flush()
        if tail:
            self.job.emit(Delta(tail))
        self.job.emit(Finished(self.reason, usage))
