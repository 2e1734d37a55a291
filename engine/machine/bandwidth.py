"""How fast a device streams weights, which bounds how fast a model decodes: each token
reads every weight it uses once. RAM is measured (reading a 128 MiB array a few times
takes ~0.1 s, once per process); GPUs are looked up by name in a table of their
published memory bandwidth and half-precision tensor throughput (a timed probe needs a
GPU, which the machines this was built on do not have)."""

from __future__ import annotations

import functools
import time

import numpy as np

PROBE_BYTES = 128 << 20
GB = 1e9
# (name fragment, bytes/s, FLOP/s fp16 dense): the published figures, most specific first.
GPU_TABLE = (
    ("H200", 4800 * GB, 989e12), ("H100", 3350 * GB, 989e12), ("A100", 2039 * GB, 312e12),
    ("RTX 5090", 1792 * GB, 209e12), ("RTX 5080", 960 * GB, 113e12),
    ("RTX 5070 Ti", 896 * GB, 88e12), ("RTX 5070", 672 * GB, 62e12),
    ("RTX 4090", 1008 * GB, 165e12), ("RTX 4080", 717 * GB, 97e12),
    ("RTX 4070 Ti", 504 * GB, 80e12), ("RTX 4070", 504 * GB, 58e12),
    ("RTX 4060 Ti", 288 * GB, 44e12), ("RTX 4060", 272 * GB, 30e12),
    ("RTX 3090", 936 * GB, 71e12), ("RTX 3080", 760 * GB, 60e12),
    ("RTX 3070", 448 * GB, 40e12), ("RTX 3060", 360 * GB, 25e12),
    ("RX 7900 XTX", 960 * GB, 123e12), ("RX 7900", 800 * GB, 100e12),
    ("M4 Max", 546 * GB, 34e12), ("M3 Max", 400 * GB, 28e12), ("M2 Ultra", 800 * GB, 54e12),
    ("M4 Pro", 273 * GB, 17e12), ("M2 Max", 400 * GB, 27e12), ("M1 Max", 400 * GB, 21e12),
    ("Apple", 120 * GB, 8e12),
)
UNKNOWN_GPU = (448 * GB, 40e12)  # a mid-range discrete card


def gpu_speed(description: str) -> tuple[float, float]:
    """(bytes/s, FLOP/s) of a GPU from its name; a mid-range card when unknown."""
    for fragment, bandwidth, flops in GPU_TABLE:
        if fragment.lower() in description.lower():
            return bandwidth, flops
    return UNKNOWN_GPU


def memory_bandwidth(size: int = PROBE_BYTES, rounds: int = 4, threads: int = 1) -> float:
    """Bytes a second this CPU reads from RAM (the best of a few rounds), `threads` at
    once, each its own `size` array (numpy's sum lets go of the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    arrays = [np.ones(size // 8, dtype=np.float64) for _ in range(threads)]
    best = float("inf")
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(rounds):
            start = time.perf_counter()
            list(pool.map(np.sum, arrays))
            best = min(best, time.perf_counter() - start)
    return threads * size / best


@functools.lru_cache(maxsize=1)
def ram_bandwidth(cores: int) -> float:
    """This machine's, measured once per process, read by as many threads as llama.cpp
    decodes with (its cores, up to 4): one thread reaches about 3/4 of what two do here
    (21 against 28 GB/s), and a forecast from one read an 8B model at 2 tok/s that
    decodes at 5."""
    return memory_bandwidth(threads=max(1, min(cores, 4)))
