"""The engine the API calls. Requests go to a lane (lane.py: a loaded model, its queue and
the worker thread that batches its requests); there is one lane, and a second when
routing keeps a small model loaded beside the large one (routing.py).

Before a request reaches a lane, two things may answer it without a model: the response
cache (response_cache.py) replays the answer of an identical deterministic request, and
the model id "auto" is resolved to the small or the large model of the routing pair.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import replace
from typing import Callable

from .catalog.chat_format import ChatFormat, chat_format_for
from .errors import HomerackError, InvalidRequest
from .events import LOADED, Delta, Event, Failed, Finished, GenerationRequest, Job, Started, Usage
from .model.embeddings import Embedder
from .batching.lane import Lane
from .llama.vocab import Vocabulary
from .model.host import EngineSettings, LoadOverride, prompt_tokens
from .catalog.models import LocalModel, ModelStore
from .response_cache import Answer, Fingerprints, ResponseCache, deterministic, request_key
from .routing import Decision, Routing, confident, decide

log = logging.getLogger("homerack.engine")


class Engine:
    def __init__(self, store: ModelStore, settings: EngineSettings = EngineSettings(),
                 cluster=None):
        self.store = store
        self.settings = settings
        self.embedder = Embedder(store, settings.load)
        self.main = Lane("engine", store, settings, cluster, reserved=lambda: self._taken(self.main))
        self.companion: Lane | None = None  # the small model of the routing pair
        self.routing: Routing | None = None
        self.answers = (ResponseCache(settings.response_cache, settings.response_cache_bytes)
                        if settings.response_cache else None)
        self._fingerprints = Fingerprints()
        self._ids = itertools.count(1)
        self._vocabs: dict = {}  # model path -> Vocabulary, for counting tokens
        self._vocab_lock = threading.Lock()
        self._routing_lock = threading.Lock()

    @property
    def host(self):
        return self.main.host

    @property
    def scheduler(self):
        return self.main.scheduler

    # -- called from any thread ---------------------------------------------

    def submit(self, request: GenerationRequest, emit: Callable[[Event], None]) -> Job:
        """Queue a request; its events go to `emit`. A routed request ("auto") gets its
        model here; a cached answer is replayed at once, from this thread."""
        job = Job(next(self._ids), request, emit)
        route = None
        if request.routed:
            routing = self._routing()
            decision = decide(routing, request)
            job.request = request = _routed(request, decision)
            route = {"mode": routing.mode, "model": decision.model.id, "reason": decision.reason}
        cached = self._cache_key(request)
        if cached and request.response_cache == "use":
            answer = self.answers.get(*cached, request.model.path)
            if answer:
                _replay(job, answer, route)
                return job
        job.emit = self._recorder(job, cached, route)
        if request.escalate_to:
            self._lane_for(request.model).put(self._first_of_cascade(job))
        else:
            self._lane_for(request.model).put(job)
        return job

    def preload(self, model: LocalModel, emit: Callable[[Event], None] = lambda _e: None) -> Job:
        """Load a model ahead of the first request (a request with nothing to generate).
        It is also the model of requests that name none."""
        self.host.default = model
        return self.submit(GenerationRequest(model=model), emit)

    def load(self, model: LocalModel, override: LoadOverride | None,
             emit: Callable[[Event], None] = lambda _e: None) -> Job:
        """Load `model` with the user's override (None: as planned), replacing what is
        loaded; it becomes the default model."""
        if override is None:
            self.host.overrides.pop(model.path, None)
        else:
            self.host.overrides[model.path] = override
        return self.preload(model, emit)

    def default_model(self) -> LocalModel | None:
        """The model a request without one gets: the loaded one, or the preloaded one."""
        loaded = self.host.loaded
        return loaded.model if loaded else self.host.default

    def chat_format_of(self, model: LocalModel) -> ChatFormat:
        """The chat format a model's prompts are rendered in (its template, or the
        fallback), read from its file's metadata without loading it."""
        return chat_format_for(self.store.inspector.inspect(model.path))

    def embed(self, model: LocalModel, inputs: list) -> tuple:
        """Vectors from an embedding model, loaded next to the chat model (embeddings.py);
        runs on the caller's thread."""
        return self.embedder.embed(model, inputs)

    def count_prompt_tokens(self, request: GenerationRequest) -> int:
        """The tokens the request's prompt will take, counted with the model's vocabulary
        alone (the model need not be loaded; the count equals its usage.prompt_tokens)."""
        model = request.model
        with self._vocab_lock:
            vocab = self._vocabs.get(model.path)
            if vocab is None:
                self.store.inspector.inspect(model.path)  # a bad file fails before llama.cpp
                vocab = self._vocabs[model.path] = Vocabulary(model.path)
            return len(prompt_tokens(request, self.chat_format_of(model), vocab)[0])

    def plan_for(self, model: LocalModel, override: LoadOverride | None = None):
        return self.host.plan_for(model, override)

    # -- routing -------------------------------------------------------------------

    def auto_model(self) -> LocalModel:
        """The model "auto" is composed for before the engine routes it (the large one:
        requests with tools always go there)."""
        return self._routing().large

    def plan_pair(self, small: LocalModel, large: LocalModel) -> dict:
        """Whether the pair fits in memory together, by the planner: the small model first,
        then the large one beside it."""
        base = {"CPU": self.embedder.bytes}
        small_plan = self.host.plan_for(small, taken=base)
        if small_plan is None:
            return {"together": False, "note": f"{small.id}: the planner cannot read its shape"}
        taken = dict(base)
        for use in small_plan.uses:
            taken[use.device] = taken.get(use.device, 0) + use.total
        large_plan = self.host.plan_for(large, taken=taken)
        together = bool(small_plan.fits and large_plan and large_plan.fits)
        note = (f"{small.id} and {large.id} stay loaded together" if together else
                f"{small.id} and {large.id} do not fit in memory together: each switch "
                "between them swaps the model (seconds per routed request)")
        return {"together": together, "note": note, "small": small_plan.as_dict(),
                "large": large_plan.as_dict() if large_plan else None}

    def set_routing(self, routing: Routing | None) -> dict | None:
        """Turn routing on with a pair (loading both when they fit together), or off."""
        with self._routing_lock:
            self.routing = routing
            old, self.companion = self.companion, None
            if old:
                old.close()
            if routing is None:
                return None
            pair = self.plan_pair(routing.small, routing.large)
            if pair["together"]:
                companion = Lane("companion", self.store, self.settings,
                                 reserved=lambda: self._taken(companion))
                companion.host.default = routing.small
                self.main.put(Job(next(self._ids), GenerationRequest(model=routing.large),
                                  lambda event: self._then_load_small(event, companion)))
                self.companion = companion
            return pair

    def _then_load_small(self, event: Event, companion: Lane) -> None:
        """The large model is in: the small one plans beside it."""
        if event is LOADED:
            companion.put(Job(next(self._ids), GenerationRequest(model=companion.host.default),
                              lambda _e: None))

    def _routing(self) -> Routing:
        routing = self.routing  # read once: another thread may turn it off meanwhile
        if routing is None:
            raise InvalidRequest(
                "model 'auto' routes each request to a small or a large model, and no pair is "
                "configured: start the engine with `homerack serve --route SMALL,LARGE` or "
                "PUT /v1/routing {\"small\": ..., \"large\": ...} (or choose the pair in the "
                "app's Routing settings)", param="model")
        return routing

    def _first_of_cascade(self, job: Job) -> Job:
        """The small model's attempt: held back until its confidence is known; the large
        model answers instead when it is too low."""
        request, held = job.request, []
        threshold, started_at = request.escalate_below, time.perf_counter()

        def first(event: Event) -> None:
            if isinstance(event, (Started, Delta)):
                held.append(event)
                return
            if isinstance(event, Finished) and event.finish_reason == "cancelled":
                job.emit(event)
                return
            confidence = event.usage.confidence if isinstance(event, Finished) else None
            route = {"mode": "cascade", "small": request.model.id,
                     "confidence": None if confidence is None else round(confidence, 6),
                     "threshold": threshold,
                     "small_s": round(time.perf_counter() - started_at, 3)}
            if isinstance(event, Finished) and confident(confidence, threshold):
                started = held[0]
                job.emit(replace(started, route={**route, "model": started.model,
                                                 "escalated": False}))
                for out in held[1:]:
                    job.emit(out)
                job.emit(event)
                return
            why = (f"small model failed: {event.error.message}" if isinstance(event, Failed)
                   else "small answer discarded: its confidence was under the threshold")
            self._escalate(job, {**route, "model": request.escalate_to.id, "escalated": True,
                                 "reason": why})

        return Job(job.id, replace(request, escalate_to=None), first, job.submitted,
                   job.cancelled)

    def _escalate(self, job: Job, route: dict) -> None:
        request = replace(job.request, model=job.request.escalate_to, escalate_to=None,
                          measure_confidence=False)

        def marked(event: Event) -> None:
            job.emit(replace(event, route=route) if isinstance(event, Started) else event)

        try:
            self._lane_for(request.model).put(Job(job.id, request, marked, job.submitted,
                                                  job.cancelled))
        except HomerackError as error:
            job.emit(Failed(error))

    def _lane_for(self, model: LocalModel) -> Lane:
        companion = self.companion
        return companion if companion and companion.serves(model.path) else self.main

    def _taken(self, lane: Lane) -> dict[str, int]:
        """Bytes per device held by models other than `lane`'s."""
        taken = {"CPU": self.embedder.bytes}
        for other in (self.main, self.companion):
            if other is not None and other is not lane:
                for device, size in other.host.held().items():
                    taken[device] = taken.get(device, 0) + size
        return taken

    # -- the response cache -------------------------------------------------------------

    def _cache_key(self, request: GenerationRequest) -> tuple[str, str] | None:
        """The request's key in the response cache and its model's fingerprint; None when
        it may not be answered from it or stored (not deterministic, opted out, no cache,
        nothing to generate)."""
        if (self.answers is None or not request.generates or request.response_cache == "off"
                or not deterministic(request)):
            return None
        try:
            if request.messages is not None:
                tools = list(request.tools) if request.tools else None
                prompt = self.chat_format_of(request.model).render(list(request.messages), tools)
            else:
                prompt = request.prompt or ""
            escalate = request.escalate_to and self._fingerprints.of(request.escalate_to.path)
            override = self._lane_for(request.model).host.overrides.get(request.model.path)
            n_ctx = override.n_ctx if override and override.n_ctx else self.settings.load.n_ctx
            fingerprint = self._fingerprints.of(request.model.path)
            return request_key(request, prompt, fingerprint, n_ctx, escalate), fingerprint
        except Exception as exc:  # the worker reports a bad template or file properly
            log.debug("response cache: no key (%s)", exc)
            return None

    def _recorder(self, job: Job, cached: tuple[str, str] | None, route: dict | None):
        """The job's emit, marking its start and keeping a finished answer for the cache
        under `cached` (key, model fingerprint)."""
        emit, pieces, first = job.emit, [], []
        mark = None if cached is None else ("bypass" if job.request.response_cache != "use"
                                             else "miss")

        def record(event: Event) -> None:
            if isinstance(event, Started):
                event = replace(event, response_cache=mark, route=event.route or route)
                first.append(event)
            elif isinstance(event, Delta) and cached:
                pieces.append(event.text)
            elif (isinstance(event, Finished) and cached and first
                  and event.finish_reason in ("stop", "length")):
                started = replace(first[0], route=None, response_cache=None)
                self.answers.put(*cached, job.request.model.path,
                                 Answer(started, tuple(pieces), event.finish_reason,
                                        event.usage.completion_tokens))
            emit(event)

        return record

    # -- figures ------------------------------------------------------------------------

    def status(self) -> dict:
        loaded = self.host.loaded
        batching = dict(self.main.published)
        companion, routing = self.companion, self.routing
        return {
            "model": _model_id(loaded),
            "n_ctx": loaded.llama.n_ctx if loaded else None,
            "offload": self._offload(loaded),
            "busy": bool(batching.get("active")),
            "memory": loaded.memory if loaded else None,
            "load_notes": list(loaded.notes) if loaded else [],
            "load_error": self.host.load_error,
            "prompt_cache": self.cache_status(),
            "queued": self.main.queued,
            "max_queue": self.settings.max_queue,
            "batching": batching,
            "embedding_model": self.embedder.model.id if self.embedder.model else None,
            "response_cache": self.answers.status() if self.answers else None,
            "routing": None if routing is None else {
                **routing.as_dict(), "together": companion is not None,
                "companion": None if companion is None else {
                    "model": _model_id(companion.host.loaded),
                    "load_error": companion.host.load_error,
                    "batching": dict(companion.published)}},
        }

    def abandon(self, error: HomerackError) -> None:
        """From another thread, when the loaded model can run no more (a worker holding
        its layers is gone, and llama.cpp may be blocked on it): every request running or
        waiting gets `error`. The process is restarted next (cluster mode)."""
        self.main.abandon(error)

    def _offload(self, loaded) -> str:
        """Where the layers run, in a few words."""
        cluster = self.host.cluster
        machines = {s.machine for s in cluster.last.stages} if cluster and cluster.last else ()
        if loaded and len(machines) > 1:
            return f"{len(machines)} machines"
        n_gpu_layers = loaded.llama.settings.n_gpu_layers if loaded else 0
        return f"{n_gpu_layers} layers on GPU" if n_gpu_layers else "CPU"

    def cluster_status(self) -> dict | None:
        cluster = self.host.cluster
        if cluster is None:
            return None
        published = self.main.published
        return {**cluster.status(self.main.evaluated_tokens()),
                "plan": cluster.last.as_dict() if cluster.last else None,
                "tokens_per_s": published.get("generated_tokens_per_s"),
                "generated_tokens": published.get("generated_tokens")}

    def cache_status(self) -> dict | None:
        loaded = self.host.loaded
        if not loaded or not loaded.cache:
            return None
        cache = loaded.cache
        return {"entries": len(cache.entries()), "ram_bytes": cache.ram_bytes(),
                "disk_bytes": cache.disk_bytes(), **cache.stats}

    def close(self) -> None:
        if self.companion:
            self.companion.close()
        self.main.close()
        if self.answers:
            self.answers.flush()
        self.embedder.close()


def _model_id(loaded) -> str | None:
    return loaded.model.id if loaded else None


def _routed(request: GenerationRequest, decision: Decision) -> GenerationRequest:
    cascade = decision.escalate_to is not None
    return replace(request, model=decision.model, routed=False,
                   escalate_to=decision.escalate_to, escalate_below=decision.threshold,
                   measure_confidence=cascade,
                   speculation="off" if cascade else request.speculation)


def _replay(job: Job, answer: Answer, route: dict | None) -> None:
    """Emit a cached answer as the engine would have streamed it."""
    begun = time.perf_counter()
    if route:  # a cached cascade answer may be the large model's
        route = {**route, "model": answer.started.model}
    started = replace(answer.started, response_cache="hit", route=route)
    job.emit(started)
    for piece in answer.pieces:
        job.emit(Delta(piece))
    usage = Usage(prompt_tokens=started.prompt_tokens,
                  completion_tokens=answer.completion_tokens,
                  cached_tokens=started.prompt_tokens, queue_s=0.0,
                  time_to_first_token_s=round(time.perf_counter() - begun, 6),
                  prompt_tokens_per_s=0.0, decode_tokens_per_s=0.0, from_response_cache=True)
    job.emit(Finished(answer.finish_reason, usage))
