"""Text checked once where it arrives: a JSON body whose strings hold a lone surrogate.

`"\\ud800"` is valid JSON (a JavaScript client that cuts a string inside an emoji sends
it), but no Unicode text: Python keeps it as a lone surrogate, and the first encoding to
UTF-8 (the tokenizer's, a template's, a database's) raises. Raised on a model's worker
thread, such an error once ended every answer the model was giving. Refused here, with a
400 naming the field, before any route reads the body: no part of the engine sees one.

The common case costs a scan of the body's bytes: a surrogate can reach a JSON string
only as a `\\uD800`-`\\uDFFF` escape (raw UTF-8 cannot encode one), and pairs of them
(an emoji escaped) are one character once parsed; only a body with such an escape is
parsed and walked.
"""

from __future__ import annotations

import json
import re

_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}")
_LONE = re.compile("[\ud800-\udfff]")


def lone_surrogate(body: bytes) -> str | None:
    """The field of the first string (or key) holding a lone surrogate, as `a.b[2].c`;
    None when there is none (or the body is no JSON: its route says so)."""
    if not _ESCAPE.search(body):
        return None
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return _first(value)


def _first(value) -> str | None:
    """Depth first, without recursion (a body may nest deeper than Python's stack)."""
    todo: list[tuple[object, str]] = [(value, "")]
    while todo:
        item, where = todo.pop()
        if isinstance(item, str):
            if _LONE.search(item):
                return where or "body"
        elif isinstance(item, dict):
            for key, inner in reversed(item.items()):
                place = f"{where}.{key}" if where else str(key)
                if _LONE.search(key):
                    return place
                todo.append((inner, place))
        elif isinstance(item, list):
            todo.extend((inner, f"{where}[{i}]") for i, inner in reversed(list(enumerate(item))))
    return None


def refusal(field: str) -> str:
    shown = field.encode("utf-8", "backslashreplace").decode()
    return (f"{shown}: the text holds a lone surrogate (a \\ud800-\\udfff escape without "
            "its pair), which is not Unicode text; send whole characters (was a string cut "
            "inside an emoji?)")
