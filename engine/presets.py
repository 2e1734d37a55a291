"""The user's choices per model, whoever loads it (the app, `serve --model`, or a request
that names it): how it loads (context, GPU layers, experts in RAM; None keeps the
planner's choice) and how long it stays (pinned: never unloaded to make room or for
idleness; a time to live when idle). Kept in a small private JSON file by model id, so a
model loaded on demand gets the same settings as one loaded by hand, after restarts too.

What a request asks for a model beside the user's presets (Ollama's `num_ctx` and
`keep_alive`) is kept too, in memory only, until a request asks otherwise: the user's
preset wins over it, and it wins over the engine's defaults.

Lanes' worker threads read while API threads write: one lock keeps the table and the
file to one writer at a time."""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from .files import dataclass_schema, read_json, write_atomic


@dataclass(frozen=True)
class LoadOverride:
    """The user's choice for a model, over the planner's: None keeps the planner's."""
    n_ctx: int | None = None
    gpu_layers: int | None = None
    cpu_moe_layers: int | None = None  # leading layers whose routed experts stay in RAM
    vision: bool | None = None  # False: its projector is not loaded (its memory given back)


@dataclass(frozen=True)
class Keep:
    """How long a model stays loaded. `ttl_s`: unloaded after this long idle (None:
    never); pinned: never unloaded but by hand."""
    pinned: bool = False
    ttl_s: float | None = None


@dataclass(frozen=True)
class Preset:
    load: LoadOverride | None = None
    keep: Keep | None = None  # None: the engine's default for how it was loaded

    def as_dict(self) -> dict:
        return {"load": asdict(self.load) if self.load else None,
                "keep": asdict(self.keep) if self.keep else None}


_SCHEMA = {"type": "object", "additionalProperties": {"type": "object", "properties": {
    "load": {"anyOf": [{"type": "null"}, dataclass_schema(LoadOverride)]},
    "keep": {"anyOf": [{"type": "null"}, dataclass_schema(Keep)]}}}}


class Presets:
    def __init__(self, path: Path | None = None):
        self.path = path
        self._lock = threading.Lock()
        self._table: dict[str, Preset] = {}
        self._asked: dict[str, Preset] = {}  # by requests, not kept
        # an unreadable file loses the presets, not the engine
        for model_id, entry in (read_json(path, _SCHEMA) or {}).items():
            self._table[model_id] = Preset(_parsed(LoadOverride, entry.get("load")),
                                           _parsed(Keep, entry.get("keep")))

    def get(self, model_id: str) -> Preset:
        with self._lock:
            return self._table.get(model_id, Preset())

    def asked(self, model_id: str) -> Preset:
        with self._lock:
            return self._asked.get(model_id, Preset())

    def ask(self, model_id: str, load: LoadOverride | None = ..., keep: Keep | None = ...) -> None:
        """What a request asks for the model (a part left out stays as it was)."""
        with self._lock:
            old = self._asked.get(model_id, Preset())
            self._asked[model_id] = Preset(old.load if load is ... else load,
                                           old.keep if keep is ... else keep)

    def set(self, model_id: str, load: LoadOverride | None = ..., keep: Keep | None = ...) -> Preset:
        """Replace what is given (None clears it; a part left out stays as it was)."""
        with self._lock:
            old = self._table.get(model_id, Preset())
            new = Preset(old.load if load is ... else load, old.keep if keep is ... else keep)
            if new == Preset():
                self._table.pop(model_id, None)
            else:
                self._table[model_id] = new
            self._write()
            return new

    def _write(self) -> None:
        if self.path is None:
            return
        write_atomic(self.path, json.dumps({k: v.as_dict() for k, v in self._table.items()},
                                           indent=1))


def _parsed(kind, entry: dict | None):
    """A dataclass from its JSON dict, unknown keys left out (a later version's file)."""
    if not entry:
        return None
    names = {f.name for f in fields(kind)}
    return kind(**{k: v for k, v in entry.items() if k in names})
