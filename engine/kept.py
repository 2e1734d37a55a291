"""`Kept`: values by key, least recently used out first, bounded by the bytes each is
charged, not by their number. The caches that hold what requests bring (checked tool
schemas, tokenized turns, compiled chat templates) hold it in one of these: counted in
entries, one 13.6 MiB schema among 1,024 once kept 470 MiB."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Generic, Hashable, TypeVar

V = TypeVar("V")


class Kept(Generic[V]):
    def __init__(self, budget: int, most: int | None = None):
        """`budget`: the bytes all values may be charged; `most`: the most one may be
        (a larger one is never kept; default a quarter of the budget)."""
        self.budget, self.most = budget, most if most is not None else budget // 4
        self.used = 0
        self._kept: OrderedDict[Hashable, tuple[V, int]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            found = self._kept.get(key)
            if found is None:
                return None
            self._kept.move_to_end(key)
            return found[0]

    def put(self, key: Hashable, value: V, cost: int) -> None:
        """Kept, charged `cost` bytes, where it fits; the least recently used leave."""
        if cost > self.most:
            return
        with self._lock:
            if key in self._kept:
                return
            self._kept[key] = (value, cost)
            self.used += cost
            while self.used > self.budget:
                self.used -= self._kept.popitem(last=False)[1][1]

    def __len__(self) -> int:
        return len(self._kept)

    def __iter__(self):
        return iter(list(self._kept))
