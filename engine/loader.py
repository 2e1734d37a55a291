"""Loading a model by the plan, and backing off when memory runs out.

A load that fails for memory is retried with a safer plan (planner.back_off: fewer
layers on the device that failed, a smaller context, a quantized KV cache) until one
loads or nothing smaller fits. Before each attempt a journal notes what is being tried:
llama.cpp aborts the whole process on some device allocation failures, and the next
engine that finds the note starts that model from a safer plan instead of dying again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from .errors import OutOfMemory
from .gguf_file import GGUFInfo
from .hardware import Hardware
from .llama_runtime import LlamaModel, LoadSettings
from .planner import Plan, Preferences, back_off, plan

ATTEMPTS = 5


@dataclass(frozen=True)
class LoadOutcome:
    llama: LlamaModel
    plan: Plan | None
    notes: tuple[str, ...]  # what the back-off changed, in words


class LoadJournal:
    """The load in progress, kept in a file while llama.cpp allocates."""

    def __init__(self, path: Path | None):
        self.path = path

    def begin(self, model: Path, used: dict[str, int]) -> None:
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps({"model": str(model), "used": used}))

    def end(self) -> None:
        if self.path:
            self.path.unlink(missing_ok=True)

    def unfinished(self, model: Path) -> dict[str, int] | None:
        """Bytes per device of a load of `model` that never finished (the process died)."""
        try:
            entry = json.loads(self.path.read_text()) if self.path else None
        except (OSError, ValueError):
            return None
        return entry["used"] if entry and entry.get("model") == str(model) else None


def describe(settings: LoadSettings) -> str:
    layers = f", {settings.n_gpu_layers} layers on GPU" if settings.n_gpu_layers else ""
    return f"{settings.n_ctx} tokens of context, {settings.kv_type} KV cache{layers}"


def _settings(base: LoadSettings, planned: Plan | None) -> LoadSettings:
    if planned is None or not planned.fits:
        return base
    return replace(base, n_ctx=planned.n_ctx, n_gpu_layers=planned.n_gpu_layers,
                   kv_type=planned.kv_type, devices=planned.gpus,
                   tensor_split=planned.tensor_split)


def _used(planned: Plan | None) -> dict[str, int]:
    return {u.device: u.total for u in planned.uses if u.total} if planned else {}


def load(path: Path, info: GGUFInfo, base: LoadSettings, hardware: Hardware | None,
         prefs: Preferences, journal: LoadJournal) -> LoadOutcome:
    """Load `path` by the plan for `hardware` (no plan when the model's shape or the
    hardware is unknown: then only the context shrinks on failure)."""
    notes: list[str] = []
    can_plan = info.shape is not None and hardware is not None
    crashed = journal.unfinished(path)
    if crashed is not None:
        notes.append("the engine stopped while loading this model last time; "
                     "starting from a safer plan")
        prefs = back_off(prefs, crashed, None)
        base = replace(base, n_ctx=max(512, base.n_ctx // 2))
    for attempt in range(ATTEMPTS):
        planned = plan(hardware, info.shape, prefs) if can_plan else None
        if attempt and planned is not None and not planned.fits:
            raise OutOfMemory(f"{path.name} does not load on this machine: "
                              + "; ".join(notes + list(planned.reasons)), device="")
        settings = _settings(base, planned)
        journal.begin(path, _used(planned))
        try:
            llama = LlamaModel(path, settings)
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
        except BaseException:
            journal.end()
            raise
        journal.end()
        if notes:
            notes.append(f"loaded with {describe(settings)} instead")
        return LoadOutcome(llama, planned, tuple(notes))
    raise OutOfMemory(f"{path.name} did not load after {ATTEMPTS} attempts: " + "; ".join(notes),
                      device="")

