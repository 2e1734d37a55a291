"""Token lists compared: how much of one another begins with. A ground-floor helper, for
the rooms that reuse what a sequence holds (batching, the prompt cache, speculation, the
llama.cpp runtime) without importing one another."""

from __future__ import annotations


def common_prefix(a, b) -> int:
    """How many leading tokens two token lists share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
