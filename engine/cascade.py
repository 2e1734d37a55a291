"""The cascade: a routed request the small model answers first, held back until its
confidence is known; when it is under the threshold (or the small model fails), the large
model answers instead and the client sees only that answer (routing.py decides when a
request cascades)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

from .errors import HomerackError
from .events import Delta, Event, Failed, Finished, GenerationRequest, Job, Started
from .routing import confident


class Cascade:
    """One cascading job: `start` puts the small model's attempt on its lane; what the
    client sees is decided when that attempt ends."""

    def __init__(self, job: Job, put: Callable[[Job], None],
                 render: Callable[[GenerationRequest], GenerationRequest]):
        self.job, self._put = job, put  # put: a job onto the lane serving its model
        self._render = render  # Engine._render: the large model's prompt in its own format
        self._held: list[Event] = []  # the small model's Started and Deltas, not yet shown
        self._started_at = time.perf_counter()

    def start(self) -> None:
        job = self.job
        self._put(Job(job.id, replace(job.request, escalate_to=None), self._small_event,
                      job.submitted, job.cancelled))

    def _small_event(self, event: Event) -> None:
        if isinstance(event, (Started, Delta)):
            self._held.append(event)
        elif isinstance(event, Finished) and event.finish_reason == "cancelled":
            self.job.emit(event)
        elif isinstance(event, Finished) and confident(event.usage.confidence,
                                                       self.job.request.escalate_below):
            self._show_small(event)
        else:
            self._escalate(event)

    def _route(self, event: Event) -> dict:
        request = self.job.request
        confidence = event.usage.confidence if isinstance(event, Finished) else None
        return {"mode": "cascade", "small": request.model.id,
                "confidence": None if confidence is None else round(confidence, 6),
                "threshold": request.escalate_below,
                "small_s": round(time.perf_counter() - self._started_at, 3)}

    def _show_small(self, finished: Finished) -> None:
        started, *deltas = self._held
        self.job.emit(replace(started, route={**self._route(finished), "model": started.model,
                                              "escalated": False}))
        for delta in deltas:
            self.job.emit(delta)
        self.job.emit(finished)

    def _escalate(self, event: Event) -> None:
        job, large = self.job, self.job.request.escalate_to
        why = (f"small model failed: {event.error.message}" if isinstance(event, Failed)
               else "small answer discarded: its confidence was under the threshold")
        route = {**self._route(event), "model": large.id, "escalated": True, "reason": why}
        # the large model's own chat format renders the prompt again (it is another
        # model's prompt: the small one's was rendered in the small one's format)
        try:
            request = self._render(replace(job.request, model=large, escalate_to=None,
                                           measure_confidence=False, rendered=None))
        except HomerackError as error:
            job.emit(Failed(error))
            return

        def marked(out: Event) -> None:
            job.emit(replace(out, route=route) if isinstance(out, Started) else out)

        try:
            self._put(Job(job.id, request, marked, job.submitted, job.cancelled))
        except HomerackError as error:
            job.emit(Failed(error))
