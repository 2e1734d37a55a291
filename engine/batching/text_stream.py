"""Turns generated token bytes into text that is safe to send.

Two things make this non-trivial: a UTF-8 character can be split across tokens, and a
stop string can be split across tokens too. Text that might be the start of a stop
string is held back until it is known not to be one.
"""

from __future__ import annotations

import codecs


class TextStream:
    def __init__(self, stop: tuple[str, ...] = ()):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = tuple(s for s in stop if s)
        self._pending = ""
        self.stopped = False

    def feed(self, piece: bytes) -> str:
        """Add a token's bytes; return the text that can be emitted now."""
        if self.stopped:
            return ""
        self._pending += self._decoder.decode(piece)
        cut = self._stop_position()
        if cut is not None:
            self.stopped = True
            text, self._pending = self._pending[:cut], ""
            return text
        keep = self._held_back()
        text = self._pending[: len(self._pending) - keep]
        self._pending = self._pending[len(text):]
        return text

    def flush(self) -> str:
        """The rest, at the end of generation."""
        if self.stopped:
            return ""
        text = self._pending + self._decoder.decode(b"", final=True)
        self._pending = ""
        return text

    def _stop_position(self) -> int | None:
        found = [i for i in (self._pending.find(s) for s in self._stop) if i >= 0]
        return min(found) if found else None

    def _held_back(self) -> int:
        """Length of the longest tail of the pending text that starts a stop string."""
        longest = 0
        for stop in self._stop:
            for n in range(min(len(stop) - 1, len(self._pending)), longest, -1):
                if self._pending.endswith(stop[:n]):
                    longest = n
                    break
        return longest
