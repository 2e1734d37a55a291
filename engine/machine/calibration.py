"""What past loads measured against what was predicted, kept in a small JSON file:
memory ratios per device kind and architecture (the planner shrinks budgets by them) and
speed ratios per phase, device kind and model kind (they correct the forecast), with the
RAM bandwidth those ratios were measured against.

Two lanes' threads record (the main model and a routing companion) while requests' threads
plan: one lock keeps the tables and the file's one temporary name to one writer."""

from __future__ import annotations

import json
import threading
from dataclasses import replace
from pathlib import Path

from ..files import NUMBERS, read_json, write_best_effort
from .hardware import Hardware


SCHEMA = {"anyOf": [NUMBERS, {  # the first format: the memory ratios alone
    "type": "object", "required": ["memory"],
    "properties": {"memory": NUMBERS, "speed": NUMBERS, "bandwidth": NUMBERS}}]}


class Calibration:
    def __init__(self, path: Path | None):
        self.path = path
        self._lock = threading.Lock()
        data = read_json(path, SCHEMA) or {}
        if "memory" not in data:  # the first format held the memory ratios alone
            data = {"memory": data, "speed": {}}
        self.ratios: dict[str, float] = data["memory"]
        self.speed: dict[str, float] = data.get("speed", {})
        self.bandwidth: dict[str, float] = data.get("bandwidth", {})

    def for_architecture(self, arch: str) -> tuple[tuple[str, float], ...]:
        prefix = f"/{arch}"
        with self._lock:
            ratios = sorted(self.ratios.items())
        return tuple((key.split("/")[0], ratio) for key, ratio in ratios if key.endswith(prefix))

    def speeds(self) -> tuple[tuple[str, float], ...]:
        """("decode/gpu/moe", measured/forecast), ... for the planner's forecast."""
        with self._lock:
            return tuple(sorted(self.speed.items()))

    def steady(self, hardware: Hardware) -> Hardware:
        """`hardware` with the RAM bandwidth of this machine's first probe. The speed
        ratios correct forecasts made with that figure, and a new probe's own noise
        (17-22 GB/s between starts here, a quiet machine) would move every calibrated
        forecast by as much."""
        if not hardware.ram_bandwidth:
            return hardware
        with self._lock:
            if "ram" not in self.bandwidth:
                self.bandwidth["ram"] = round(hardware.ram_bandwidth)
                self._write()
            return replace(hardware, ram_bandwidth=float(self.bandwidth["ram"]))

    def record(self, kind: str, arch: str, ratio: float) -> None:
        self._update(self.ratios, f"{kind}/{arch}", ratio)

    def record_speed(self, key: str, ratio: float) -> None:
        self._update(self.speed, key, ratio)

    def _update(self, table: dict[str, float], key: str, ratio: float) -> None:
        with self._lock:
            old = table.get(key)
            table[key] = round(ratio if old is None else 0.7 * old + 0.3 * ratio, 4)
            self._write()

    def _write(self) -> None:
        if self.path:
            write_best_effort(self.path, json.dumps({"memory": self.ratios, "speed": self.speed,
                                                     "bandwidth": self.bandwidth}, indent=1))
