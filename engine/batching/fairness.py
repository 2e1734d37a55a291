"""Fair turns between the people sharing one lane.

Requests wait here per client (a paired device by name; None for the owner), not in one
line: when a slot frees, the owner goes first if the owner chose precedence, then the
client holding the fewest slots, then the one served longest ago. So one device's ten
parallel requests take their turns with everyone else's instead of ahead of them. And
with more than one slot, no device holds them all: the last one stays free for someone
else, so a request from another device starts at once instead of after a whole answer.
"""

from __future__ import annotations

import itertools
import time
from collections import Counter, deque

from ..events import Job


class FairQueue:
    """Owned by the lane's worker thread."""

    def __init__(self):
        self._waiting: dict[str | None, deque[Job]] = {}
        self._served: dict[str | None, int] = {}
        self._turns = itertools.count()

    def __len__(self) -> int:
        return sum(len(q) for q in self._waiting.values())

    def add(self, job: Job) -> None:
        self._waiting.setdefault(job.request.client, deque()).append(job)

    def drain(self) -> list[Job]:
        jobs = [job for q in self._waiting.values() for job in q]
        self._waiting.clear()
        return jobs

    def next(self, running: Counter, slots: int) -> Job | None:
        """The job whose turn it is, taken; None when none may start now."""
        eligible = [c for c, q in self._waiting.items()
                    if q and (c is None or slots == 1 or running[c] < slots - 1)]
        if not eligible:
            return None
        client = min(eligible, key=lambda c: (not self._waiting[c][0].request.precedence,
                                              running[c], self._served.get(c, -1)))
        self._served[client] = next(self._turns)
        job = self._waiting[client].popleft()
        if not self._waiting[client]:
            del self._waiting[client]
        return job

    def waiting(self, running: Counter, slots: int) -> list[dict]:
        """Who waits, how long and why, for /health and the Devices page."""
        now = time.perf_counter()
        out = []
        for client, jobs in self._waiting.items():
            held = running[client]
            why = (f"holds {held} of {slots} slots; one stays free for others"
                   if client is not None and slots > 1 and held >= slots - 1
                   else "every slot is busy; its turn comes in order")
            out.append({"client": client or "owner", "requests": len(jobs), "holds": held,
                        "waited_s": round(now - jobs[0].submitted, 3), "why": why})
        return out
