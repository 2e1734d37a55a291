"""The desktop app's settings (sampling, the routing pair), each kept in a small JSON file."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.7
    top_p: float = 0.95
    max_tokens: int = 1024
    seed: int = -1  # -1: a new random seed each time
    speculation: str = "off"  # "off", "lookup", or "draft:<model id>" ("draft:auto" picks)

    def as_request(self) -> dict:
        request = {"temperature": self.temperature, "top_p": self.top_p,
                   "max_tokens": self.max_tokens, "seed": None if self.seed < 0 else self.seed}
        if self.speculation.startswith("draft:"):
            request["draft_model"] = self.speculation.split(":", 1)[1]
        else:
            request["speculation"] = self.speculation
        return request


@dataclass(frozen=True)
class RoutingPair:
    """The models behind model "auto" (engine/routing.py); empty: routing off."""
    small: str = ""
    large: str = ""
    mode: str = "rules"  # or "cascade"

    @property
    def on(self) -> bool:
        return bool(self.small and self.large)


def load_settings(path: Path, kind: type):
    """The settings of dataclass `kind` in `path`, defaults for whatever is missing or bad."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return kind()
    known = {f.name for f in fields(kind)}
    try:
        return replace(kind(), **{k: v for k, v in data.items() if k in known})
    except TypeError:
        return kind()


def save_settings(path: Path, settings) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(settings)))
