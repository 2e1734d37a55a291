"""What each paired device uses, and its limits: requests in flight (running or waiting),
tokens in the last minute, and today's requests and tokens for the Devices page.

A request over a limit is refused before it queues (RateLimited: a 429 with the seconds
after which it would pass). Tokens are counted when an answer ends, prompt and answer
together, as the hosted APIs count them.
"""

from __future__ import annotations

import datetime
import math
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass

from ..errors import RateLimited
from ..events import Failed, Finished

WINDOW_S = 60.0


@dataclass(frozen=True)
class Limits:
    parallel: int = 8                 # requests in flight at once (running or waiting)
    tokens_per_minute: int = 100_000  # prompt and answer tokens; 0: no limit


@dataclass
class _Use:
    jobs: dict            # job id -> the job, in flight
    window: deque         # (time, tokens) in the last minute
    day: str = ""
    requests_today: int = 0
    tokens_today: int = 0
    last_wait_s: float = 0.0  # the last answer's time in the queue


class Meter:
    """Thread-safe: requests are taken on the routes' worker threads and end on the
    engine's."""

    def __init__(self):
        self._lock = threading.Lock()
        self._use: dict[str, _Use] = defaultdict(lambda: _Use({}, deque()))

    def take(self, client: str, job, limits: Limits, counted: bool = True) -> None:
        """Count `job` as in flight for `client`, or refuse it (RateLimited); `counted`:
        one of its requests today (not the building of a turn it then submits)."""
        now = time.monotonic()
        with self._lock:
            use = self._use[client]
            if len(use.jobs) >= limits.parallel:
                raise RateLimited(f"{client!r} has {len(use.jobs)} requests in flight, its "
                                  f"limit; wait for one to end", retry_after_s=1)
            used = self._recent(use, now)
            if limits.tokens_per_minute and used >= limits.tokens_per_minute:
                wait = WINDOW_S - (now - use.window[0][0])
                raise RateLimited(f"{client!r} used {used:,} tokens in the last minute, its "
                                  f"limit is {limits.tokens_per_minute:,}",
                                  retry_after_s=max(1, math.ceil(wait)))
            use.jobs[job.id] = job
            if counted:
                self._today(use).requests_today += 1

    def ended(self, client: str, job_id: int, tokens: int, wait_s: float) -> None:
        with self._lock:
            use = self._use[client]
            use.jobs.pop(job_id, None)
            if tokens:
                use.window.append((time.monotonic(), tokens))
                self._today(use).tokens_today += tokens
                use.last_wait_s = wait_s

    def cancel(self, client: str | None = None) -> int:
        """Stop every request of `client` (its key was revoked), or of every device
        (sharing turned off); how many there were."""
        with self._lock:
            uses = [self._use[client]] if client is not None else list(self._use.values())
            jobs = [job for use in uses for job in use.jobs.values()]
        for job in jobs:
            job.cancel()
        return len(jobs)

    def status(self, client: str) -> dict:
        with self._lock:
            use = self._use[client]
            return {"in_flight": len(use.jobs),
                    "tokens_last_minute": self._recent(use, time.monotonic()),
                    "requests_today": self._today(use).requests_today,
                    "tokens_today": use.tokens_today, "last_wait_s": round(use.last_wait_s, 3)}

    @staticmethod
    def _recent(use: _Use, now: float) -> int:
        while use.window and now - use.window[0][0] >= WINDOW_S:
            use.window.popleft()
        return sum(tokens for _, tokens in use.window)

    @staticmethod
    def _today(use: _Use) -> _Use:
        day = datetime.date.today().isoformat()
        if use.day != day:
            use.day, use.requests_today, use.tokens_today = day, 0, 0
        return use


class Metered:
    """A device's job's `emit`: passes every event on, and counts the request's end."""

    def __init__(self, emit, meter: Meter, client: str, job_id: int):
        self._emit, self._meter, self._client, self._id = emit, meter, client, job_id

    def __call__(self, event) -> None:
        if isinstance(event, Finished):
            usage = event.usage
            self._meter.ended(self._client, self._id,
                              usage.prompt_tokens + usage.completion_tokens, usage.queue_s)
        elif isinstance(event, Failed):
            self._meter.ended(self._client, self._id, 0, 0.0)
        self._emit(event)
