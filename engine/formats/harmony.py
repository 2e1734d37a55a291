"""OpenAI's harmony format (gpt-oss): the answer is a run of messages, each a header
(`<|channel|>analysis`, a recipient ` to=functions.NAME`, `<|constrain|>json`), then
`<|message|>` and a body ended by `<|end|>`, `<|call|>` or `<|return|>`; the next begins
with `<|start|>assistant`. The analysis channel is the reasoning, final and commentary
are the answer, a message to `functions.NAME` is a call whose body is its arguments.
`<|end|>` closes a message, not the turn: only `<|return|>` and `<|call|>` end it."""

from __future__ import annotations

import re

from .parsed import Parsed, ParsedCall
from .scan import first, held

START, MESSAGE = "<|start|>", "<|message|>"
BODY_ENDS = ("<|end|>", "<|call|>", "<|return|>")
MARKERS = ("<|channel|>", MESSAGE, START, "<|constrain|>", *BODY_ENDS)
ENDS = ("<|return|>", "<|call|>")
CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")
RECIPIENT = re.compile(r"to=([^\s<]+)")


def parse(text: str, partial: bool, separate: bool) -> Parsed:
    content, reasoning, calls = [], [], []
    for i, segment in enumerate(_segments(text)):
        if MESSAGE not in segment:  # a header still coming, or plain text (first only)
            head = segment.lstrip()
            if partial and "to=".startswith(head[:3]):
                continue
            if i == 0 and not head.startswith(("<|", "to=")) and "to=" not in segment[:16]:
                content.append(segment[:len(segment) - held(segment, MARKERS)] if partial
                               else segment)  # plain text: the model left its format
            continue
        header, body = segment.split(MESSAGE, 1)
        closed = _body_end(body)
        if closed is None and partial:
            body = body[:len(body) - held(body, BODY_ENDS)]
        elif closed is not None:
            body = body[:closed]
        recipient = RECIPIENT.search(header)
        channel = CHANNEL.search(header)
        kind = channel.group(1) if channel else "final"
        if recipient and recipient.group(1).startswith("functions."):
            calls.append(ParsedCall(recipient.group(1)[len("functions."):], body.strip()))
        elif kind == "analysis" and separate:
            reasoning.append(body)
        elif kind == "analysis":
            content.append(f"<|channel|>analysis{MESSAGE}{body}"
                           + ("<|end|>" if closed is not None else ""))
        else:
            content.append(body)
    return Parsed("".join(content).strip(), "\n".join(reasoning).strip(), tuple(calls))


def _segments(text: str) -> list[str]:
    parts = text.split(START)
    return [parts[0]] + [p[len("assistant"):] if p.startswith("assistant") else p
                         for p in parts[1:]]


def _body_end(body: str) -> int | None:
    found = first(body, BODY_ENDS)
    return found[0] if found else None
