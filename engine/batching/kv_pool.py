"""Bookkeeping of the KV memory's cells, mirroring llama.cpp's KV cache.

Unified (`kv_unified`): all sequences draw from one pool of `total` cells, and a sequence
alone may use all of them. A cell may belong to several sequences at once: copying a
prefix to another sequence (`llama_memory_seq_cp`) shares its cells instead of storing
them twice. Split: each sequence has a stream of its own (`total` / sequences cells), so
nothing is shared (a copied prefix is copied) and no sequence takes another's room.
llama.cpp does not report cell use, so the engine keeps this ledger next to every
decode, copy and removal; admission and eviction decisions read it.
"""

from __future__ import annotations

import itertools
from collections import Counter


class CellLedger:
    def __init__(self, total: int, split: bool = False):
        self.total, self.split = total, split
        self._cells: dict[int, list[int]] = {}  # seq id -> the cell of each position
        self._owners: Counter[int] = Counter()  # cell -> how many sequences hold it
        self._ids = itertools.count()

    @property
    def used(self) -> int:
        return len(self._owners)

    @property
    def free(self) -> int:
        return self.total - self.used

    def held(self, seq_id: int) -> int:
        return len(self._cells.get(seq_id, ()))

    def own(self, seq_id: int) -> int:
        """Cells only this sequence holds: what dropping it frees."""
        return sum(self._owners[c] == 1 for c in self._cells.get(seq_id, ()))

    def hold(self, seq_id: int, n: int) -> None:
        """The sequence now holds positions 0..n-1: new cells for new positions, those
        past n released."""
        cells = self._cells.setdefault(seq_id, [])
        while len(cells) > n:
            self._release(cells.pop())
        while len(cells) < n:
            cell = next(self._ids)
            self._owners[cell] = 1
            cells.append(cell)

    def share(self, src: int, dst: int, n: int) -> None:
        """dst (empty) now holds src's first n positions in the same cells (split: in
        copies of them)."""
        self.drop(dst)
        if self.split:
            self.hold(dst, n)
            return
        cells = self._cells[src][:n]
        self._cells[dst] = list(cells)
        self._owners.update(cells)

    def drop(self, seq_id: int) -> None:
        for cell in self._cells.pop(seq_id, ()):
            self._release(cell)

    def clear(self) -> None:
        self._cells.clear()
        self._owners.clear()

    def _release(self, cell: int) -> None:
        self._owners[cell] -= 1
        if not self._owners[cell]:
            del self._owners[cell]
