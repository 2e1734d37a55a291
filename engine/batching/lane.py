"""One loaded model and the worker thread that runs it: requests arrive in a bounded
inbox and wait in fair turns between the people asking (fairness.py); the worker owns
the model and runs the scheduler (scheduler.py), admitting waiting requests whenever a
slot and KV memory are free and stepping all active ones together.

A request for another model than the loaded one waits at the head of the line until the
running requests end, then the model is swapped. Results go back through each job's
`emit` callback as small frozen events (events.py). The engine holds a lane per loaded
model (fleet.py).
"""

from __future__ import annotations

import math
import queue
import threading
import time
from collections import Counter
from typing import Callable

from ..errors import HomerackError, ModelUnloaded, QueueFull
from ..events import CANCELLED, LOADED, Failed, Job
from ..model.host import ModelHost
from ..settings import EngineSettings
from ..catalog.models import ModelStore
from .fairness import FairQueue
from .scheduler import Scheduler, as_error

PUBLISH_S = 0.1  # how often the worker refreshes the figures other threads read
IDLE_SAVE_S = 1.0  # idle this long, the worker saves resident conversations to the cache
# The worker parses grammars (llama.cpp's parser recurses once per nested group): a stack
# of its own size on every system. macOS gives threads 512 KiB, on which a maxLength of
# 1,200 overflowed; conversation/json_schema.py bounds schemas for this size with a wide margin.
WORKER_STACK_BYTES = 16 << 20


class Lane:
    def __init__(self, name: str, store: ModelStore, settings: EngineSettings, cluster=None,
                 reserved: Callable[[], dict[str, int]] = dict, presets=None, calibration=None,
                 after: tuple["Lane", ...] = ()):
        self.settings = settings
        self.host = ModelHost(store, settings, cluster, reserved=reserved, presets=presets,
                              calibration=calibration)
        self.last_used = time.monotonic()  # its last request's put or end
        self._after = after  # lanes unloading to make room: their memory is freed first
        self._drain = False  # stopping: finish what was put first
        self._why: str | None = None  # why it was closed, for the requests running then
        self.scheduler = Scheduler(self.host, settings)
        self.published: dict = {}  # the scheduler's figures, for other threads
        self._queue: queue.Queue[Job | None] = queue.Queue()  # the inbox; None: stop
        self._fair = FairQueue()  # taken from the inbox by the worker, in turns
        self._pending: Job | None = None  # first in line, waiting for memory or a swap
        self._stopping = False
        self._closed = False
        self._now = False  # close(): stop at once, even with every slot busy
        self._published_at = 0.0
        self._thread = threading.Thread(target=self._work, name=f"homerack-{name}", daemon=True)
        previous = threading.stack_size(WORKER_STACK_BYTES)  # for the thread started next
        try:
            self._thread.start()
        finally:
            threading.stack_size(previous)

    # -- called from any thread ---------------------------------------------

    def put(self, job: Job) -> None:
        if self._closed:
            raise ModelUnloaded("the model was unloaded (to make room, the routing pair changed, "
                                "or the engine is stopping); retry")
        self.last_used = time.monotonic()
        waiting = self._queue.qsize() + len(self._fair)  # (the one in hand not counted)
        if waiting >= self.settings.max_queue:
            waves = (waiting + 1) / self.scheduler.lanes
            wait = math.ceil(self.scheduler.figures.mean_request_s * waves)
            raise QueueFull(f"the engine queue is full ({self.settings.max_queue} waiting); "
                            "retry shortly", retry_after_s=max(1, wait))
        self._queue.put_nowait(job)

    def serves(self, path) -> bool:
        """The lane holds, or is about to hold, the model at `path`."""
        loaded = self.host.loaded
        return (loaded is not None and loaded.model.path == path) or \
            (self.host.default is not None and self.host.default.path == path)

    @property
    def model(self):
        """The model it holds, or is about to hold (None: none yet)."""
        loaded = self.host.loaded
        return loaded.model if loaded is not None else self.host.default

    @property
    def queued(self) -> int:
        return self._queue.qsize() + len(self._fair) + (self._pending is not None)

    @property
    def busy(self) -> bool:
        return bool(self.scheduler.active) or self.queued > 0 or self.host.loading is not None

    def idle_s(self) -> float:
        return 0.0 if self.busy else time.monotonic() - self.last_used

    def retire(self) -> None:
        """Unload when what was put so far has ended (nothing more is taken)."""
        self._drain = self._closed = True
        self._queue.put(None)

    def abandon(self, error: HomerackError) -> None:
        """Every request running or waiting gets `error` (see Engine.abandon)."""
        for slot in list(self.scheduler.active):
            slot.job.emit(Failed(error))
        if self._pending is not None:
            self._pending.emit(Failed(error))
        for job in self._fair.drain():
            job.emit(Failed(error))
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                job.emit(Failed(error))

    def close(self, why: str | None = None) -> None:
        """Stop now. Requests waiting end with an error saying `why`; running ones too
        when there is a why (unloaded by hand), else as cancelled (the engine stops)."""
        self._why = why  # before the thread can see _now and fail what runs with it
        self._closed = self._now = True
        self._queue.put(None)
        self._thread.join(timeout=30)
        self.abandon(ModelUnloaded(f"the model was unloaded ({why or 'the engine is stopping'})"
                                   "; retry"))

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def alive(self) -> bool:
        return self._thread.is_alive()

    # -- the worker thread ----------------------------------------------------

    def _work(self) -> None:
        while not self._ended():
            self._admit()
            if active := len(self.scheduler.active):
                self._guarded(self.scheduler.step)
                if len(self.scheduler.active) != active:
                    self._publish(force=True)
                    self.last_used = time.monotonic()
            elif not self._stopping:
                self._wait()
            self._publish()
        for slot in self.scheduler.active:  # requests still running when told to stop
            slot.job.emit(Failed(ModelUnloaded(f"the model was unloaded ({self._why})"))
                          if self._why else CANCELLED)
            slot.end()
        if self.host.loaded:
            self.scheduler.residency.save_all()
        self.host.close()

    def _ended(self) -> bool:
        """Told to stop and (when retiring) nothing left to finish; or closed with every
        slot busy (such a lane would not read its queue, and the stop there, until a
        request ended; with room it takes what was put before the stop, then stops)."""
        return self._now and not self.scheduler.has_room() or \
            self._stopping and not (self._drain and (self.scheduler.active or self._pending
                                                     or len(self._fair)))

    def _admit(self) -> None:
        """Start queued requests while there is a free slot and memory for them."""
        while self.scheduler.has_room() and not (self._stopping and not self._drain):
            job = self._pending or self._take()
            if job is None:
                return
            # first in line until it has started: the lane stays busy meanwhile, so the
            # reaper never retires one whose first load is still probing and planning
            self._pending = job
            if not self._start(job):
                return
            self._pending = None
            self._publish(force=True)

    def _take(self) -> Job | None:
        """The next job in fair turns, after moving what arrived into them (up to a stop:
        what was put before it is still taken)."""
        while not self._stopping:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is None:
                self._stopping = True
            else:
                self._fair.add(job)
        return self._fair.next(self._running(), self.scheduler.lanes)

    def _running(self) -> Counter:
        return Counter(slot.job.request.client for slot in self.scheduler.active)

    def _wait(self) -> None:
        """Nothing runs: block for the next request, saving resident conversations to
        the cache meanwhile (so a crash or restart loses none of them)."""
        try:
            job = self._queue.get(timeout=IDLE_SAVE_S)
        except queue.Empty:
            if self.host.loaded:
                self._guarded(self.scheduler.residency.save_one)
            return
        if job is None:
            self._stopping = True
        else:
            self._fair.add(job)

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
                    self.scheduler.residency.save_all()
                for lane in self._after:
                    lane.join()
                self.host.ensure_loaded(model)
                self.scheduler.attach()
                if self.host.cluster:
                    self.host.cluster.mark_loaded(self.evaluated_tokens())
            if not job.request.generates:
                job.emit(LOADED)
                return True
            return self.scheduler.admit(job)
        except Exception as exc:  # a bad request or a failed load must not kill the worker
            # nor end its neighbours: whatever raised (a tokenizer's UnicodeEncodeError
            # once did), it was this job's work; the cells it may have touched are checked
            # by residency's guard before any prompt trusts them
            job.emit(Failed(as_error(exc)))
            return True

    def _guarded(self, work: Callable[[], object]) -> None:
        try:
            work()
        except Exception as exc:  # a failed decode fails the requests, not the worker
            self.scheduler.fail_all(as_error(exc))

    def _publish(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._published_at >= PUBLISH_S:
            self.published = self.scheduler.status() if self.host.loaded else {}
            if len(self._fair):
                self.published["waiting"] = self._fair.waiting(self._running(),
                                                               self.scheduler.lanes)
            self._published_at = now

    def evaluated_tokens(self) -> int:
        """Tokens evaluated so far (the cluster's per-token link figures count from it)."""
        return self.scheduler.figures.evaluated_tokens()

