"""The engine the API calls: requests queue FIFO in a bounded queue; one worker thread
owns the loaded model and runs the scheduler (scheduler.py), admitting queued requests
whenever a slot and KV memory are free and stepping all active ones together.

A request for another model than the loaded one waits at the head of the line until the
running requests end, then the model is swapped. Results go back through each job's
`emit` callback as small frozen events (events.py).
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time
from typing import Callable

from .chat_format import ChatFormat, chat_format_for
from .errors import HomerackError, QueueFull
from .events import CANCELLED, LOADED, Event, Failed, GenerationRequest, Job
from .embeddings import Embedder
from .llama_runtime import Vocabulary
from .model_host import EngineSettings, LoadOverride, ModelHost, prompt_tokens
from .models import LocalModel, ModelStore
from .scheduler import Scheduler

PUBLISH_S = 0.1  # how often the worker refreshes the figures other threads read
IDLE_SAVE_S = 1.0  # idle this long, the worker saves resident conversations to the cache


class Engine:
    def __init__(self, store: ModelStore, settings: EngineSettings = EngineSettings(),
                 cluster=None):
        self.store = store
        self.settings = settings
        self.embedder = Embedder(store, settings.load)
        self.host = ModelHost(store, settings, cluster, reserved=lambda: self.embedder.bytes)
        self.scheduler = Scheduler(self.host, settings)
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=settings.max_queue)
        self._pending: Job | None = None  # first in line, waiting for memory or a swap
        self._ids = itertools.count(1)
        self._stopping = False
        self._published: dict = {}
        self._published_at = 0.0
        self._vocabs: dict = {}  # model path -> Vocabulary, for counting tokens
        self._vocab_lock = threading.Lock()
        self._thread = threading.Thread(target=self._work, name="homerack-engine", daemon=True)
        self._thread.start()

    # -- called from any thread ---------------------------------------------

    def submit(self, request: GenerationRequest, emit: Callable[[Event], None]) -> Job:
        job = Job(next(self._ids), request, emit)
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            waves = (self._queue.qsize() + 1) / max(1, self.settings.parallel)
            wait = math.ceil(self.scheduler.mean_request_s * waves)
            raise QueueFull(f"the engine queue is full ({self.settings.max_queue} waiting); "
                            "retry shortly", retry_after_s=max(1, wait)) from None
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

    def status(self) -> dict:
        loaded = self.host.loaded
        batching = dict(self._published)
        return {
            "model": loaded.model.id if loaded else None,
            "n_ctx": loaded.llama.n_ctx if loaded else None,
            "offload": self._offload(loaded),
            "busy": bool(batching.get("active")),
            "memory": loaded.memory if loaded else None,
            "load_notes": list(loaded.notes) if loaded else [],
            "load_error": self.host.load_error,
            "prompt_cache": self.cache_status(),
            "queued": self._queue.qsize() + (self._pending is not None),
            "max_queue": self.settings.max_queue,
            "batching": batching,
            "embedding_model": self.embedder.model.id if self.embedder.model else None,
        }

    def abandon(self, error: HomerackError) -> None:
        """From another thread, when the loaded model can run no more (a worker holding
        its layers is gone, and llama.cpp may be blocked on it): every request running or
        waiting gets `error`. The process is restarted next (cluster mode)."""
        for slot in list(self.scheduler.active):
            slot.job.emit(Failed(error))
        if self._pending is not None:
            self._pending.emit(Failed(error))
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.emit(Failed(error))

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
        return {**cluster.status(self._evaluated_tokens()),
                "plan": cluster.last.as_dict() if cluster.last else None,
                "tokens_per_s": self._published.get("generated_tokens_per_s"),
                "generated_tokens": self._published.get("generated_tokens")}

    def _evaluated_tokens(self) -> int:
        """Tokens evaluated so far (the cluster's per-token link figures count from it)."""
        totals = self.scheduler.totals
        return totals["prompt_tokens"] + totals["generated_tokens"]

    def cache_status(self) -> dict | None:
        loaded = self.host.loaded
        if not loaded or not loaded.cache:
            return None
        cache = loaded.cache
        return {"entries": len(cache.entries()), "ram_bytes": cache.ram_bytes(),
                "disk_bytes": cache.disk_bytes(), **cache.stats}

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)
        self.embedder.close()

    # -- the worker thread ----------------------------------------------------

    def _work(self) -> None:
        while not self._stopping:
            self._admit()
            if active := len(self.scheduler.active):
                self._guarded(self.scheduler.step)
                if len(self.scheduler.active) != active:
                    self._publish(force=True)
            elif not self._stopping:
                self._wait()
            self._publish()
        for slot in self.scheduler.active:  # requests still running when told to stop
            slot.job.emit(CANCELLED)
            slot.end()
        if self.host.loaded:
            self.scheduler.save_all()
        self.host.close()

    def _admit(self) -> None:
        """Start queued requests while there is a free slot and memory for them."""
        while self.scheduler.has_room() and not self._stopping:
            job = self._pending or self._take()
            self._pending = None
            if job is None:
                return
            if not self._start(job):
                self._pending = job
                return
            self._publish(force=True)

    def _take(self) -> Job | None:
        try:
            job = self._queue.get_nowait()
        except queue.Empty:
            return None
        if job is None:
            self._stopping = True
        return job

    def _wait(self) -> None:
        """Nothing runs: block for the next request, saving resident conversations to
        the cache meanwhile (so a crash or restart loses none of them)."""
        try:
            job = self._queue.get(timeout=IDLE_SAVE_S)
        except queue.Empty:
            if self.host.loaded:
                self._guarded(self.scheduler.save_one)
            return
        if job is None:
            self._stopping = True
        else:
            self._pending = job

    def _start(self, job: Job) -> bool:
        """Load its model if needed and admit it; False when it must wait."""
        if job.cancelled.is_set():
            job.emit(CANCELLED)
            return True
        model = job.request.model
        try:
            if not self.host.is_loaded(model):
                if self.scheduler.active:
                    return False  # the swap waits for the running requests
                if self.host.loaded:
                    self.scheduler.save_all()
                self.host.ensure_loaded(model)
                self.scheduler.attach()
                if self.host.cluster:
                    self.host.cluster.mark_loaded(self._evaluated_tokens())
            if not job.request.generates:
                job.emit(LOADED)
                return True
            return self.scheduler.admit(job)
        except Exception as exc:  # a bad request or a failed load must not kill the worker
            job.emit(Failed(_as_error(exc)))
            if not isinstance(exc, HomerackError) and self.host.loaded:
                self.scheduler.fail_all(_as_error(exc))
            return True

    def _guarded(self, work: Callable[[], object]) -> None:
        try:
            work()
        except Exception as exc:  # a failed decode fails the requests, not the worker
            self.scheduler.fail_all(_as_error(exc))

    def _publish(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._published_at >= PUBLISH_S:
            self._published = self.scheduler.status() if self.host.loaded else {}
            self._published_at = now


def _as_error(exc: Exception) -> HomerackError:
    return exc if isinstance(exc, HomerackError) else HomerackError(f"internal error: {exc!r}")
