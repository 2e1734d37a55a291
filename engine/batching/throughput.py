"""A lane's figures: running totals, tokens per second over a recent window (what the app
and /metrics show), and the mean request time that Retry-After estimates come from."""

from __future__ import annotations

import time
from collections import deque

RATE_WINDOW_S = 10.0  # tokens/s are reported over this window


class Throughput:
    def __init__(self):
        self.totals = {"prompt_tokens": 0, "generated_tokens": 0, "steps": 0,
                       "requests": 0, "evictions": 0, "memory_full": 0, "model_errors": 0,
                       "kv_mismatches": 0}
        self.mean_request_s = 2.0
        self.step_s = self.decode_s = 0.0  # plain steps' time, and llama_decode's share
        self._recent: deque[tuple[float, int, int]] = deque()  # (time, prompt, generated)

    def count(self, prompt: int = 0, generated: int = 0) -> None:
        self.totals["prompt_tokens"] += prompt
        self.totals["generated_tokens"] += generated
        self._recent.append((time.monotonic(), prompt, generated))

    def host_ms_per_step(self) -> float:
        """Milliseconds a plain step spends outside llama_decode (batching, sampling,
        streaming: the engine's own cost), on average so far."""
        steps = self.totals["steps"]
        return round(1000 * (self.step_s - self.decode_s) / steps, 3) if steps else 0.0

    def decode_ms_per_step(self) -> float:
        """Milliseconds a plain step spends in llama_decode, on average so far."""
        steps = self.totals["steps"]
        return round(1000 * self.decode_s / steps, 3) if steps else 0.0

    def request_took(self, seconds: float) -> None:
        self.mean_request_s = 0.8 * self.mean_request_s + 0.2 * seconds

    def evaluated_tokens(self) -> int:
        return self.totals["prompt_tokens"] + self.totals["generated_tokens"]

    def rates(self) -> tuple[float, float]:
        """Prompt and generated tokens per second over the last RATE_WINDOW_S."""
        horizon = time.monotonic() - RATE_WINDOW_S
        while self._recent and self._recent[0][0] < horizon:
            self._recent.popleft()
        recent = list(self._recent)
        if not recent:
            return 0.0, 0.0
        span = max(time.monotonic() - recent[0][0], 1.0)
        return (sum(r[1] for r in recent) / span, sum(r[2] for r in recent) / span)
