"""`Kept` (engine/kept.py), the caches of what requests bring, bounded in bytes: what is
charged never passes the budget, the least recently used leave first, one value too large
is never kept; the tool-schema cache keeps only what `remember` is given."""

from __future__ import annotations

from engine.conversation.conversation import KnownTools, tool
from engine.kept import Kept


def test_values_are_bounded_by_their_bytes_least_recently_used_out_first():
    kept = Kept(100, most=60)
    kept.put("a", 1, 40)
    kept.put("b", 2, 40)
    assert kept.get("a") == 1  # used: b is now the oldest
    kept.put("c", 3, 40)
    assert kept.get("b") is None and kept.get("a") == 1 and kept.get("c") == 3
    assert kept.used == 80
    kept.put("huge", 4, 61)
    assert kept.get("huge") is None and kept.used == 80


def test_a_tool_is_kept_only_once_its_request_has_started():
    known = KnownTools(budget=1 << 20)
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    made = tool("search", "Finds things", schema, "tools[0]")
    assert known.get(made.key) is None  # read, checked, not kept (the request may fail)
    known.remember([made])
    assert known.get(made.key) is made
    big = tool("big", "d" * (300 << 10), schema, "tools[1]")
    known.remember([big])  # over TOOL_KEPT_MAX: checked each time
    assert known.get(big.key) is None and known.kept.used < 1 << 20
