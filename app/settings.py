"""The desktop app's sampling settings, kept in a small JSON file."""

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


def load_sampling(path: Path) -> Sampling:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return Sampling()
    known = {f.name for f in fields(Sampling)}
    try:
        return replace(Sampling(), **{k: v for k, v in data.items() if k in known})
    except TypeError:
        return Sampling()


def save_sampling(path: Path, sampling: Sampling) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(sampling)))
