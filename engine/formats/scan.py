"""Small scanners the families share: where a JSON value ends, how much of a partial
answer's tail may still become a marker (held back, so no delta leaks half a marker),
and the typing of a parameter written as bare text."""

from __future__ import annotations

import json


def json_end(text: str, start: int) -> tuple[int, int] | None:
    """(begin, end) of the JSON value at `start` (leading blanks skipped); end is None
    when the value is not complete yet. None when no value begins there."""
    begin = start
    while begin < len(text) and text[begin].isspace():
        begin += 1
    if begin >= len(text):
        return None
    depth, in_string, escaped = 0, False, False
    for i in range(begin, len(text)):
        ch = text[i]
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
                if depth == 0:
                    return begin, i + 1
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return begin, i + 1
        elif depth == 0 and ch in ",\n<" and i > begin:
            return begin, i  # a bare number, true, false or null
    return begin, None


def held(text: str, markers) -> int:
    """Length of the longest tail of `text` that begins one of the markers (but is not
    the whole marker): a partial answer keeps it back until it is known."""
    longest = 0
    for marker in markers:
        for n in range(min(len(marker) - 1, len(text)), longest, -1):
            if text.endswith(marker[:n]):
                longest = n
                break
    return longest


def without_held(text: str, markers, partial: bool) -> str:
    return text[:len(text) - held(text, markers)] if partial else text


def without(text: str, markers) -> str:
    """`text` with every one of the markers taken out."""
    for marker in markers:
        text = text.replace(marker, "")
    return text


def first(text: str, markers, start: int = 0) -> tuple[int, str] | None:
    """The earliest of the markers in `text` from `start`: (index, marker)."""
    found = [(i, m) for m in markers if (i := text.find(m, start)) >= 0]
    return min(found) if found else None


def typed(value: str, schema: dict | None) -> object:
    """A parameter written as bare text (XML-style calls), as its schema's type: text for
    strings, JSON for anything else that parses, else the text itself."""
    kind = (schema or {}).get("type")
    if kind == "string":
        return value
    try:
        return json.loads(value.strip())
    except ValueError:
        return value


def unescaped_prefix(text: str, start: int) -> tuple[str, bool]:
    """The JSON string whose body begins at `start`, unescaped as far as it is complete;
    True when its closing quote was seen."""
    out, i = [], start
    while i < len(text):
        ch = text[i]
        if ch == '"':
            return "".join(out), True
        if ch == "\\":
            end = i + (6 if text[i + 1:i + 2] == "u" else 2)
            if end > len(text):
                break
            try:
                out.append(json.loads(f'"{text[i:end]}"'))
            except ValueError:
                out.append(text[i:end])
            i = end
            continue
        out.append(ch)
        i += 1
    return "".join(out), False
