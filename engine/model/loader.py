"""Loading a model by the plan, and backing off when memory runs out.

A load that fails for memory is retried with a safer plan (planner.back_off: fewer
layers on the device that failed, a smaller context, a quantized KV cache) until one
loads or nothing smaller fits. Before each attempt a journal notes what is being tried:
llama.cpp aborts the whole process on some device allocation failures, and the next
engine that finds the note starts that model from a safer plan instead of dying again.

The journal stays open through the first evaluations of a freshly loaded model: some
kernels die there (llama.cpp's AMX weight repack faults on some Xeons, #20824). The next
engine that finds such an entry records that model as unsafe to repack for this llama.cpp
build and loads it with `use_extra_bufts` off from then on.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path

from ..errors import ModelLoadFailed, OutOfMemory
from ..catalog.gguf_file import GGUFInfo
from ..machine.hardware import Hardware
from ..llama.runtime import LlamaModel
from ..settings import LoadSettings
from ..llama.backend import build_id
from ..machine.planner import Plan, Preferences, back_off, plan
from ..files import STRINGS, read_json, write_best_effort

ATTEMPTS = 5


@dataclass(frozen=True)
class LoadOutcome:
    llama: LlamaModel
    plan: Plan | None
    notes: tuple[str, ...]  # what the back-off changed, in words


# An entry without "stage" is an older journal's, of a load.
_ENTRY = {"type": "object", "required": ["model", "used"], "properties": {
    "model": {"type": "string"}, "stage": {"enum": ["loading", "evaluating"]},
    "repack": {"type": "boolean"},
    "used": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}}}}


class LoadJournal:
    """The load in progress and its first evaluations, kept in a file per model (beside
    `path`: an engine loads several models at once, in lanes of their own) while llama.cpp
    allocates and first computes; models whose repacked weights killed an engine, kept
    for good in another (`no_repack_path`)."""

    def __init__(self, path: Path | None, no_repack_path: Path | None = None):
        self.path = path
        self.no_repack_path = no_repack_path
        self._current: Path | None = None  # the file of the load being watched

    def file_for(self, model: Path) -> Path | None:
        if self.path is None:
            return None
        digest = hashlib.sha256(str(model).encode()).hexdigest()[:12]
        return self.path.with_name(f"{self.path.stem}-{digest}{self.path.suffix}")

    def begin(self, model: Path, used: dict[str, int]) -> None:
        self._write(model, {"model": str(model), "used": used, "stage": "loading"})

    def evaluating(self, model: Path, used: dict[str, int], repack: bool) -> None:
        self._write(model, {"model": str(model), "used": used, "stage": "evaluating",
                            "repack": repack})

    def _write(self, model: Path, entry: dict) -> None:
        self._current = self.file_for(model)
        if self._current:  # on a full disk this load goes unwatched, and still loads
            write_best_effort(self._current, json.dumps(entry))

    def end(self) -> None:
        """The watched load ended without a crash: it ran, it failed cleanly, it was
        unloaded, or the engine stopped."""
        if self._current:
            self._current.unlink(missing_ok=True)
            self._current = None

    def unfinished(self, model: Path) -> dict | None:
        """The entry of a load or first evaluation of `model` that never finished (the
        process died): "stage", "used" (bytes per device) and "repack"."""
        entry = read_json(self.file_for(model), _ENTRY)
        return entry if entry and entry.get("model") == str(model) else None

    def _no_repack(self) -> list[str]:
        return read_json(self.no_repack_path, STRINGS) or []

    def repack_is_unsafe(self, model: Path) -> bool:
        return _repack_key(model) in self._no_repack()

    def mark_repack_unsafe(self, model: Path) -> None:
        if self.no_repack_path and not self.repack_is_unsafe(model):
            write_best_effort(self.no_repack_path,
                              json.dumps(self._no_repack() + [_repack_key(model)]))


def _repack_key(model: Path) -> str:
    """A model under one llama.cpp build: a new build gets a new chance."""
    return f"{model} | {build_id()}"


def _repack_safety(path: Path, crashed: dict | None, journal: LoadJournal) -> list[str]:
    """Why `path` loads without repacked weights (empty when it need not)."""
    if crashed and crashed.get("stage") == "evaluating" and crashed.get("repack"):
        journal.mark_repack_unsafe(path)
        return ["the engine died during its first evaluations of this model last time (as "
                "llama.cpp's AMX kernels do on some CPUs): loaded without repacked weights "
                "(use_extra_bufts off), which is safe but may be slower"]
    if journal.repack_is_unsafe(path):
        return ["loaded without repacked weights (use_extra_bufts off): an engine died "
                f"evaluating them before (listed in {journal.no_repack_path.name})"]
    return []


def describe(settings: LoadSettings) -> str:
    layers = f", {settings.n_gpu_layers} layers on GPU" if settings.n_gpu_layers else ""
    where = "in RAM" if settings.expert_device == "CPU" else f"on {settings.expert_device}"
    experts = f", experts of {settings.cpu_moe_layers} layers {where}" \
        if settings.moves_experts else ""
    split = ", every layer split across the GPUs" if settings.split_mode == "tensor" else ""
    streams = f" for each of {settings.n_seq_max} KV streams" if settings.kv_split else ""
    return (f"{settings.n_ctx} tokens of context{streams}, {settings.kv_type} KV cache"
            f"{layers}{experts}{split}")


def by_plan(base: LoadSettings, planned: Plan | None) -> LoadSettings:
    """The load settings a plan gives (`base` where it has none or does not fit)."""
    if planned is None or not planned.fits:
        return base
    # a split KV cache: a stream for each lane and the spare (residents use idle lanes)
    streams = dict(n_seq_max=planned.lanes + 1, kv_split=True) if planned.kv_split else {}
    return replace(base, n_ctx=planned.n_ctx, n_gpu_layers=planned.n_gpu_layers,
                   kv_type=planned.kv_type, devices=planned.gpus,
                   tensor_split=planned.tensor_split, cpu_moe_layers=planned.cpu_moe_layers,
                   split_mode=planned.split_mode, expert_device=planned.expert_device,
                   **streams)


def _used(planned: Plan | None) -> dict[str, int]:
    return {u.device: u.total for u in planned.uses if u.total} if planned else {}


def load(path: Path, info: GGUFInfo, base: LoadSettings, hardware: Hardware | None,
         prefs: Preferences, journal: LoadJournal, planner=plan,
         on_progress=None) -> LoadOutcome:
    """Load `path` by the plan for `hardware` (no plan when the model's shape or the
    hardware is unknown: then only the context shrinks on failure). `planner`: the
    cluster's placement when workers take part; `on_progress(fraction)` as it reads."""
    notes: list[str] = []
    can_plan = info.shape is not None and hardware is not None
    crashed = journal.unfinished(path)
    safety = _repack_safety(path, crashed, journal)
    if safety:
        base = replace(base, repack=False)
        hardware = replace(hardware, cpu_repack=False) if hardware else None
    elif crashed is not None and crashed.get("stage", "loading") == "loading":
        notes.append("the engine stopped while loading this model last time; "
                     "starting from a safer plan")
        prefs = back_off(prefs, crashed["used"], None)
        base = replace(base, n_ctx=max(512, base.n_ctx // 2))
    for attempt in range(ATTEMPTS):
        planned = planner(hardware, info.shape, prefs) if can_plan else None
        if planned is not None and not planned.fits and (attempt or planner is not plan):
            raise OutOfMemory(f"{path.name} does not load on this machine: "
                              + "; ".join(notes + list(planned.reasons)), device="")
        settings = by_plan(base, planned)
        journal.begin(path, _used(planned))
        try:
            llama = LlamaModel(path, settings, on_progress)
        except OutOfMemory as exc:
            journal.end()
            notes.append(f"{describe(settings)} ran out of memory on {exc.device}")
            if planned is None:
                if settings.n_ctx <= 512:
                    raise
                base = replace(base, n_ctx=settings.n_ctx // 2)
            else:
                prefs = back_off(prefs, _used(planned), exc.device)
            continue
        except ModelLoadFailed as exc:
            journal.end()
            if settings.split_mode != "tensor":
                raise
            # llama.cpp refuses tensor splits for some architectures and backends
            notes.append(f"splitting every layer across the GPUs failed ({exc.message})")
            prefs = replace(prefs, tensor_parallel=False)
            continue
        except BaseException:
            journal.end()
            raise
        journal.evaluating(path, _used(planned), settings.repack)
        if notes:
            notes.append(f"loaded with {describe(settings)} instead")
        return LoadOutcome(llama, planned, tuple(safety + notes))
    raise OutOfMemory(f"{path.name} did not load after {ATTEMPTS} attempts: " + "; ".join(notes),
                      device="")

