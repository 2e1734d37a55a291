"""A short measured probe of how fast a machine streams weights: decoding one token reads
every weight of the layers a device holds once, so a device's memory bandwidth sets its
share of the time per token. Reading a 128 MiB array a few times takes ~0.1 s."""

from __future__ import annotations

import time

import numpy as np

PROBE_BYTES = 128 << 20


def memory_bandwidth(size: int = PROBE_BYTES, rounds: int = 4) -> float:
    """Bytes a second this CPU reads from RAM (the best of a few rounds)."""
    data = np.ones(size // 8, dtype=np.float64)
    best = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return size / best
