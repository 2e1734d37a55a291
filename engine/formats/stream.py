"""An answer read as it streams: each piece is added to the text so far, the whole is
parsed again as partial, and what grew since the last parse goes out as deltas (as
llama.cpp's server diffs successive partial parses). A family's parse yields only what
can no longer change, so every delta extends what was sent."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from .families import Family
from .parsed import CallArgs, CallStart, Parsed, Reasoning, Text
from .tool_syntax import Schemas


def new_call_id(prefix: str = "call_") -> str:
    return prefix + secrets.token_hex(12)


@dataclass(frozen=True)
class Reading:
    """How to read one answer: its family, the tools offered (None: calls are not read),
    reasoning apart or inline, and whether the prompt left the model inside it."""
    family: Family
    schemas: Schemas | None = None
    separate: bool = True
    opened: bool = False
    id_prefix: str = "call_"

    def parse(self, text: str, partial: bool) -> Parsed:
        return self.family.parse(text, partial, separate=self.separate, opened=self.opened,
                                 schemas=self.schemas)


class FormatStream:
    """`feed` pieces of the answer and get events; `finish` at the end."""

    def __init__(self, reading: Reading):
        self.reading = reading
        self.text = ""
        self.reasoning, self.content = "", ""  # what was sent of each
        self.ids: list[str] = []   # of the calls sent so far
        self.args: list[str] = []  # what was sent of each call's arguments

    def feed(self, piece: str) -> list:
        self.text += piece
        return self._grown(self.reading.parse(self.text, partial=True))

    def finish(self) -> list:
        return self._grown(self.reading.parse(self.text, partial=False))

    def _grown(self, parsed: Parsed) -> list:
        events: list = []
        if (more := _more(self.reasoning, parsed.reasoning)) is not None:
            self.reasoning = parsed.reasoning
            events.append(Reasoning(more))
        if (more := _more(self.content, parsed.content)) is not None:
            self.content = parsed.content
            events.append(Text(more))
        for index, call in enumerate(parsed.calls):
            if index == len(self.ids):
                self.ids.append(call.id or new_call_id(self.reading.id_prefix))
                self.args.append("")
                events.append(CallStart(index, self.ids[index], call.name))
            if (more := _more(self.args[index], call.arguments)) is not None:
                self.args[index] = call.arguments
                events.append(CallArgs(index, more))
        return events


def _more(sent: str, now: str) -> str | None:
    """What `now` adds to `sent`; None when nothing, or when `now` does not extend it (a
    parse that changed its mind: nothing already sent can be taken back)."""
    return now[len(sent):] if len(now) > len(sent) and now.startswith(sent) else None

