"""The models one engine holds at once, each in a lane of its own (batching/lane.py).

The main lane holds the model the app or `serve --model` chose (requests that name none
get it). A request naming a model no lane holds loads it just in time, in a lane of its
own, when the planner finds room for it beside what is held; when it does not, lanes
beside the main one that are not pinned are unloaded first, idle before busy and least
recently used first (a busy one finishes its requests; resident conversations go to the
prompt cache, whose disk tier keeps returning to them fast); when that is not enough, the
main lane swaps its model, as a one-model engine does. With
workers (a cluster) the main lane is the only one: it places one model across machines.

Jobs are put under one lock: requests for a model being loaded all wait in its one lane
(never two instances of a model), and a lane chosen for unloading takes no more. A reaper
thread unloads lanes idle past their time to live (presets.Keep).
"""

from __future__ import annotations

import itertools
import threading
import time
from typing import Callable

from .batching.lane import Lane
from .catalog.models import LocalModel, ModelStore
from .errors import OutOfMemory
from .events import Job
from .machine.calibration import Calibration
from .settings import EngineSettings
from .presets import Keep, Presets

REAP_S = 0.5  # how often idle lanes are checked against their time to live


class Fleet:
    def __init__(self, store: ModelStore, settings: EngineSettings, cluster, presets: Presets,
                 also_held: Callable[[], dict[str, int]]):
        self.store, self.settings, self.cluster, self.presets = store, settings, cluster, presets
        self.calibration = Calibration(settings.calibration_file)  # one writer for all lanes
        self.pinned: frozenset[str] = frozenset()  # model ids pinned for routing's pair
        self._also_held = also_held  # bytes per device held outside the lanes (embeddings)
        self._lock = threading.RLock()
        self._names = itertools.count(1)
        self.main = self._open("engine", cluster)
        self._beside: list[Lane] = []  # lanes of models loaded beside the main one
        self._leaving: list[Lane] = []  # retired lanes, finishing and unloading
        self._stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap, name="homerack-reaper", daemon=True)
        self._reaper.start()

    def lanes(self) -> list[Lane]:
        return [self.main, *self._beside]

    # -- called from any thread ---------------------------------------------

    def put(self, job: Job) -> None:
        with self._lock:
            self.lane_for(job.request.model).put(job)

    def lane_for(self, model: LocalModel) -> Lane:
        """The lane that holds `model`, or will: an idle main lane, a new lane beside
        the others (unloading idle ones to make room), or the main lane swapping."""
        with self._lock:
            if held := self.holding(model):
                return held
            if self.main.model is None:  # the first model: it becomes the default one
                self.main.host.make_default(model)
                return self.main
            if self.cluster is not None:
                return self.main
            return self._open_beside(model) or self._swapping_lane(model)

    def holding(self, model: LocalModel) -> Lane | None:
        """The lane that holds `model`, or is about to."""
        return next((lane for lane in self.lanes() if lane.serves(model.path)), None)

    def promote(self, model: LocalModel) -> None:
        """`model` becomes the main lane's (the one requests naming none get): a lane
        holding it already becomes the main one; otherwise the main lane swaps to it."""
        with self._lock:
            lane = next((lane for lane in self._beside if lane.serves(model.path)), None)
            if lane is not None:
                self._beside.remove(lane)
                self._beside.append(self.main)
                self.main = lane
            self.main.host.make_default(model)

    def unload(self, model_id: str, why: str) -> bool:
        """Unload the model now (requests running or waiting for it end with an error
        saying `why`); False when no lane holds it."""
        with self._lock:
            lane = next((lane for lane in self.lanes() if lane.host.loaded is not None
                         and lane.host.loaded.model.id == model_id), None)
            if lane is None:
                return False
            self._drop(lane)
        lane.close(why)
        return True

    def keep_of(self, lane: Lane) -> Keep:
        """How long the lane's model stays: the user's preset; else what a request last
        asked (Ollama's keep_alive); else pinned while it is
        one of routing's pair; else never unloaded for idleness in the main lane, and
        after settings.jit_ttl_s beside it."""
        model = lane.model
        preset = self.presets.get(model.id).keep if model else None
        if preset is not None:
            return preset
        asked = self.presets.asked(model.id).keep if model else None
        if asked is not None:
            return asked
        if model is not None and model.id in self.pinned:
            return Keep(pinned=True)
        return Keep(ttl_s=None if lane is self.main else self.settings.jit_ttl_s)

    def taken(self, lane: Lane | None, leaving: tuple[Lane, ...] = ()) -> dict[str, int]:
        """Bytes per device held by the lanes other than `lane` and `leaving`."""
        taken = dict(self._also_held())
        for other in self.lanes():
            if other is not lane and other not in leaving:
                for device, size in other.host.held().items():
                    taken[device] = taken.get(device, 0) + size
        return taken

    def plan_together(self, small: LocalModel, large: LocalModel) -> dict:
        """Whether the pair fits in memory together, by the planner: the small model first,
        then the large one beside it."""
        base = dict(self._also_held())
        small_plan = self.main.host.plan_for(small, taken=base)
        if small_plan is None:
            return {"together": False, "note": f"{small.id}: the planner cannot read its shape"}
        taken = dict(base)
        for use in small_plan.uses:
            taken[use.device] = taken.get(use.device, 0) + use.total
        large_plan = self.main.host.plan_for(large, taken=taken)
        together = bool(small_plan.fits and large_plan and large_plan.fits)
        note = (f"{small.id} and {large.id} stay loaded together" if together else
                f"{small.id} and {large.id} do not fit in memory together: each switch "
                "between them swaps the model (seconds per routed request)")
        return {"together": together, "note": note, "small": small_plan.as_dict(),
                "large": large_plan.as_dict() if large_plan else None}

    def loaded(self) -> list[dict]:
        """The models held (or loading), for status, /v1/models/loaded and the app."""
        out = []
        for lane in self.lanes():
            loaded, model = lane.host.loaded, lane.model
            if loaded is None and lane.host.loading is None:
                continue
            keep = self.keep_of(lane)
            out.append({
                "id": model.id, "state": "loading" if loaded is None else "ready",
                "default": lane is self.main, "memory": lane.host.held(),
                "n_ctx": loaded.llama.n_ctx if loaded else None,
                "running": len(lane.scheduler.active), "queued": lane.queued,
                "idle_s": round(lane.idle_s(), 1), "pinned": keep.pinned, "ttl_s": keep.ttl_s,
                "loads": lane.host.loads,
                "model_errors": lane.scheduler.figures.totals["model_errors"],
                "waiting": lane.published.get("waiting", []),  # fairness.FairQueue.waiting
                "generated_tokens_per_s": lane.published.get("generated_tokens_per_s"),
                "decode_tokens_per_s": _measured_decode(loaded)})
        return out

    def close(self) -> None:
        self._stop.set()
        for lane in self.lanes():
            lane.close()
        for lane in self._leaving:
            lane.join(timeout=30)

    # -- choosing a lane (under the lock) --------------------------------------------

    def _open_beside(self, model: LocalModel) -> Lane | None:
        """A new lane for `model` when it fits beside the others, less the ones it unloads
        for room (idle before busy, least recently used first; not pinned): a busy one
        finishes its requests first, and the new lane loads when it is gone. None when
        it fits under no such choice."""
        idle = sorted((lane for lane in self._beside if not self.keep_of(lane).pinned),
                      key=lambda lane: (lane.busy, lane.last_used))
        leaving: list[Lane] = []
        while not (len(self.lanes()) - len(leaving) < self.settings.max_models
                   and self._fits(model, tuple(leaving))):
            if not idle:
                return None
            leaving.append(idle.pop(0))
        for lane in leaving:
            self._retire(lane)
        lane = self._open(f"model-{next(self._names)}", after=tuple(leaving))
        lane.host.make_default(model)
        self._beside.append(lane)
        return lane

    def _fits(self, model: LocalModel, leaving: tuple[Lane, ...]) -> bool:
        planned = self.main.host.plan_for(model, self.presets.get(model.id).load,
                                          taken=self.taken(None, leaving))
        return bool(planned is not None and planned.fits)

    def _swapping_lane(self, model: LocalModel) -> Lane:
        """The lane that swaps to `model` when its running requests end: the main one,
        or when the user pinned it, the least recently used lane that is not pinned."""
        for lane in [self.main, *sorted(self._beside, key=lambda lane: lane.last_used)]:
            if not self.keep_of(lane).pinned:
                return lane
        held = ", ".join(lane.model.id for lane in self.lanes() if lane.model)
        raise OutOfMemory(f"{model.id} does not fit in memory beside the pinned models "
                          f"({held}): unpin or unload one of them", device="CPU")

    def _retire(self, lane: Lane) -> None:
        """Unload the lane's model once what it was given has ended."""
        self._drop(lane)
        lane.retire()
        self._leaving = [old for old in self._leaving if old.alive()] + [lane]

    def _drop(self, lane: Lane) -> None:
        """Take the lane out of the fleet; the main lane is replaced by an empty one
        that keeps its default model (a request naming none loads it again)."""
        if lane is self.main:
            default = lane.host.default
            self.main = self._open("engine", self.cluster, after=(lane,))
            if default is not None:
                self.main.host.make_default(default)
        else:
            self._beside.remove(lane)

    def _open(self, name: str, cluster=None, after: tuple[Lane, ...] = ()) -> Lane:
        lane: Lane | None = None
        lane = Lane(name, self.store, self.settings, cluster, presets=self.presets,
                    calibration=self.calibration, after=after,
                    reserved=lambda: self.taken(lane))
        return lane

    # -- the reaper thread --------------------------------------------------------------

    def _reap(self) -> None:
        while not self._stop.wait(REAP_S):
            with self._lock:
                for lane in [lane for lane in self.lanes() if self._expired(lane)]:
                    self._retire(lane)

    def _expired(self, lane: Lane) -> bool:
        """Idle past its time to live; or, beside the main lane, holding nothing (its
        load failed: a damaged file, an embedding model asked to chat)."""
        if lane.busy:
            return False
        idle = time.monotonic() - lane.last_used
        if lane.host.loaded is None:
            return lane is not self.main and idle >= REAP_S
        keep = self.keep_of(lane)
        return not keep.pinned and keep.ttl_s is not None and idle >= keep.ttl_s


def _measured_decode(loaded) -> float | None:
    """The loaded model's decode rate as its first lone request measured it."""
    speed = ((loaded.memory or {}).get("speed") or {}) if loaded else {}
    return (speed.get("decode") or {}).get("measured")
