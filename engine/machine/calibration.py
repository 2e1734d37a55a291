"""Measured/predicted memory ratios from past loads, per device kind and architecture,
kept in a small JSON file and handed to the planner (which shrinks budgets by them)."""

from __future__ import annotations

import json
import os
from pathlib import Path


class Calibration:
    def __init__(self, path: Path | None):
        self.path = path
        try:
            self.ratios: dict[str, float] = json.loads(path.read_text()) if path else {}
        except (OSError, ValueError):
            self.ratios = {}

    def for_architecture(self, arch: str) -> tuple[tuple[str, float], ...]:
        prefix = f"/{arch}"
        return tuple((key.split("/")[0], ratio) for key, ratio in sorted(self.ratios.items())
                     if key.endswith(prefix))

    def record(self, kind: str, arch: str, ratio: float) -> None:
        key = f"{kind}/{arch}"
        old = self.ratios.get(key)
        self.ratios[key] = round(ratio if old is None else 0.7 * old + 0.3 * ratio, 4)
        if self.path:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self.ratios, indent=1))
            os.replace(tmp, self.path)
