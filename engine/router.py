"""The routing pair the engine holds, for the model id "auto": set and unset (both models
loaded and pinned when they fit together, the small one beside the large), and each routed
request's model chosen by routing.py's pure decision. A service the routes use directly
(`engine.router`); the engine asks it once per request, before the chat is rendered.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Callable

from .catalog.models import LocalModel, ModelStore
from .errors import InvalidRequest
from .events import LOADED, Event, GenerationRequest, Job
from .fleet import Fleet
from .routing import Decision, Routing, decide, route_between


class Router:
    def __init__(self, store: ModelStore, fleet: Fleet,
                 submit: Callable[[GenerationRequest, Callable[[Event], None]], Job]):
        self.store, self.fleet, self._submit = store, fleet, submit
        self.pair: Routing | None = None
        self._lock = threading.Lock()

    @property
    def companion(self):
        """The lane holding the small model of the pair beside the large one."""
        pair = self.pair
        if pair is None:
            return None
        small, large = self.fleet.holding(pair.small), self.fleet.holding(pair.large)
        return small if small is not large else None

    def between(self, small: str, large: str, mode: str, threshold: float) -> Routing:
        """The routing of two model ids, checked (routing.py); not applied yet."""
        return route_between(self.store, small, large, mode, threshold)

    def plan(self, small: LocalModel, large: LocalModel) -> dict:
        """Whether the pair fits in memory together (fleet.py's plan of the two)."""
        return self.fleet.plan_together(small, large)

    def set(self, pair: Routing | None) -> dict | None:
        """Turn routing on with a pair (both loaded and pinned when they fit together),
        or off (the small model is unloaded unless it is the default one)."""
        with self._lock:
            old, self.pair = self.pair, pair
            self.fleet.pinned = frozenset()
            if old is not None and self.fleet.holding(old.small) not in (None, self.fleet.main):
                self.fleet.unload(old.small.id, "the routing pair changed")
            if pair is None:
                return None
            together = self.plan(pair.small, pair.large)
            if together["together"]:
                self.fleet.pinned = frozenset((pair.small.id, pair.large.id))
                self._submit(GenerationRequest(model=pair.large),
                             lambda event: self._then_load_small(event, pair.small))
            return together

    def _then_load_small(self, event: Event, small: LocalModel) -> None:
        """The large model is in: the small one plans beside it."""
        if event is LOADED:
            self._submit(GenerationRequest(model=small), lambda _e: None)

    def auto_model(self) -> LocalModel:
        """The model "auto" is composed for before the request is routed (the large one:
        requests with tools always go there)."""
        return self._pair().large

    def route(self, job: Job) -> dict | None:
        """A routed request's model, chosen now (job.request changes); how, for Started."""
        if not job.request.routed:
            return None
        pair = self._pair()
        decision = decide(pair, job.request)
        job.request = _routed(job.request, decision)
        return {"mode": pair.mode, "model": decision.model.id, "reason": decision.reason}

    def _pair(self) -> Routing:
        pair = self.pair  # read once: another thread may turn it off meanwhile
        if pair is None:
            raise InvalidRequest(
                "model 'auto' routes each request to a small or a large model, and no pair is "
                "configured: start the engine with `homerack serve --route SMALL,LARGE` or "
                "PUT /v1/routing {\"small\": ..., \"large\": ...} (or choose the pair in the "
                "app's Routing settings)", param="model")
        return pair


def _routed(request: GenerationRequest, decision: Decision) -> GenerationRequest:
    cascade = decision.escalate_to is not None
    return replace(request, model=decision.model, routed=False,
                   escalate_to=decision.escalate_to, escalate_below=decision.threshold,
                   measure_confidence=cascade,
                   speculation="off" if cascade else request.speculation)
