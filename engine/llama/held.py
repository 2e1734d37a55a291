"""What each sequence's KV cells hold, token by token, as llama.cpp will have them at its
next evaluation: recorded by the runtime at every call that changes a sequence (an
evaluation, a removal, a copy, a restore, a clear).

The batching room plans by its own bookkeeping; before it trusts a sequence's cells for a
new prompt, it checks them against this record (`Residency.verify`), so a mistake in that
bookkeeping costs an evaluation, never an answer computed from another prompt.

llama.cpp copies a split cache's stream at the next llama_decode, not when asked
(`seq_cp` across streams queues the copy, cells' positions moved at once, their data
later): until then a restore into either stream would be overwritten by the copy, or
copied along. The runtime settles queued copies before any restore or snapshot; should
one ever reach a stream unsettled, the record calls what it will hold unknown.
"""

from __future__ import annotations


class HeldTokens:
    """The tokens at positions 0.. of each sequence whose cells were computed from
    exactly those tokens; a gap or an overlap ends what is known."""

    def __init__(self):
        self._tokens: dict[int, list[int]] = {}
        self._queued: list[tuple[int, int]] = []  # stream copies llama.cpp has yet to make

    def of(self, seq_id: int) -> list[int]:
        return self._tokens.get(seq_id, [])

    @property
    def copies_queued(self) -> bool:
        return bool(self._queued)

    def evaluated(self, seq_id: int, start: int, tokens) -> None:
        """Tokens evaluated at positions start.. (a decode settles queued copies first)."""
        self._queued.clear()
        held = self._tokens.setdefault(seq_id, [])
        if start == len(held):
            held.extend(tokens)
        else:  # a gap, or positions held twice: their attention saw something else
            del held[min(start, len(held)):]

    def removed(self, seq_id: int, from_pos: int) -> None:
        del self._tokens.setdefault(seq_id, [])[from_pos:]

    def copied(self, src: int, dst: int, n: int, queued: bool) -> None:
        """dst holds src's first n tokens (`queued`: once llama.cpp copies the stream)."""
        self._tokens[dst] = list(self.of(src)[:n])
        if queued:
            self._queued.append((src, dst))

    def restored(self, seq_id: int, tokens) -> None:
        """A saved state was written into the sequence. A queued copy into it would
        overwrite it, and one out of it would carry it along: those streams are unknown."""
        self._tokens[seq_id] = list(tokens)
        for src, dst in self._queued:
            if seq_id in (src, dst):
                self._tokens[dst] = []

    def cleared(self) -> None:
        self._tokens.clear()
        self._queued.clear()
