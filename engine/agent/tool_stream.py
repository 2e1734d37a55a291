"""Reads a model's output as it streams and tells text from tool calls, in the forms the
chat templates use (tool_formats.py): text goes out as it comes; a call goes out as its
name, then its arguments' JSON in pieces as the model writes them (OpenAI's
`delta.tool_calls`, Anthropic's `input_json_delta`).

A call is an object {"name": ..., "arguments" | "parameters": {...}} inside the format's
region (after "<tool_call>", "[TOOL_CALLS]", or JSON at the start of the output). Under a
grammar the name always comes first; a free-running model that writes the arguments
first still gets its call, as one piece at the end. A region holding no call is text.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass

CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
RESPONSE_HEAD = re.compile(r'\s*\{\s*"response"\s*:\s*"')
_ESCAPE = re.compile(r'\\(u[0-9a-fA-F]{4}|[^u])')


@dataclass(frozen=True)
class Text:
    text: str


@dataclass(frozen=True)
class CallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArgs:
    index: int
    text: str  # a piece of the arguments' JSON text


def new_call_id(prefix: str = "call_") -> str:
    return prefix + secrets.token_hex(12)


class _ValueEnd:
    """Finds where a JSON value ends, a character at a time."""

    def __init__(self):
        self.depth, self.in_string, self.escaped, self.started = 0, False, False, False

    def feed(self, ch: str) -> bool:
        """True when `ch` completes the value."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif ch == "\\":
                self.escaped = True
            elif ch == '"':
                self.in_string = False
                return self.depth == 0
            return False
        if not self.started and ch.isspace():
            return False
        self.started = True
        if ch == '"':
            self.in_string = True
        elif ch in "{[":
            self.depth += 1
        elif ch in "}]":
            self.depth -= 1
            return self.depth == 0
        return False


class ToolStream:
    """`feed` the output's text as it comes and get events; `finish` at the end."""

    def __init__(self, openers: tuple[str, ...], at_start: tuple[str, ...],
                 id_prefix: str = "call_", response_key: bool = False):
        self.openers = openers      # start a call region anywhere in the text
        self.at_start = at_start    # start one only as the output's first characters
        self.id_prefix = id_prefix
        self.response_key = response_key  # {"response": "..."} is text (generic format)
        self.region: str | None = None  # text since the region opened
        self.pending = ""               # text not yet sent, before any region
        self.cursor = 0                 # in `region`: scanned up to here
        self.calls: list[CallStart] = []
        self._value: _ValueEnd | None = None  # the arguments being streamed
        self._response: int | None = None     # in `region`: where response text resumes
        self._response_done = False
        self.sent_text = False

    # -- feeding ------------------------------------------------------------------------

    def feed(self, text: str) -> list:
        if self.region is not None:
            self.region += text
            return self._scan()
        self.pending += text
        return self._before_region()

    def finish(self) -> list:
        if self.region is None:
            out = [Text(self.pending)] if self.pending else []
            self.pending = ""
            return out
        events = self._scan()
        if self._value is not None:  # cut off (max_tokens): the arguments so far
            self._value = None
        elif not self.calls and self._response is None:
            events += self._whole_region()
        return events

    # -- before a region ----------------------------------------------------------------

    def _before_region(self) -> list:
        text = self.pending
        if not self.sent_text:
            stripped = text.lstrip()
            if not stripped:
                return []
            for opener in self.at_start:
                if stripped.startswith(opener):
                    return self._open(text, len(text) - len(stripped))
                if opener.startswith(stripped):
                    return []  # it may still become one
        found = [(text.find(o), o) for o in self.openers if o in text]
        if found:
            return self._open(text, min(found)[0])
        keep = _tail_starting_any(text, self.openers)
        out, self.pending = text[:len(text) - keep], text[len(text) - keep:]
        if out:
            self.sent_text = True
            return [Text(out)]
        return []

    def _open(self, text: str, at: int) -> list:
        before, self.region, self.pending = text[:at], text[at:], ""
        events = [Text(before)] if before.strip() or (before and self.sent_text) else []
        return events + self._scan()

    # -- inside a region ----------------------------------------------------------------

    def _scan(self) -> list:
        events: list = []
        while True:
            if self._value is not None:
                if not self._stream_arguments(events):
                    return events
            elif self._response is not None or (self.response_key and not self.calls
                                                 and self._response_head()):
                self._stream_response(events)
                return events
            else:
                match = CALL_HEAD.search(self.region, self.cursor)
                if match is None:
                    return events
                name = json.loads(f'"{match.group(1)}"')
                start = CallStart(len(self.calls), new_call_id(self.id_prefix), name)
                self.calls.append(start)
                events.append(start)
                self.cursor, self._value = match.end(), _ValueEnd()

    def _stream_arguments(self, events: list) -> bool:
        """Send the arguments written so far; True when they are complete."""
        begin, value = self.cursor, self._value
        while not value.started and begin < len(self.region) and self.region[begin].isspace():
            begin += 1
        for i in range(begin, len(self.region)):
            if value.feed(self.region[i]):
                self.cursor, self._value = i + 1, None
                events.append(CallArgs(len(self.calls) - 1, self.region[begin:i + 1]))
                return True
        self.cursor = len(self.region)
        if self.cursor > begin:
            events.append(CallArgs(len(self.calls) - 1, self.region[begin:]))
        return False

    def _response_head(self) -> bool:
        match = RESPONSE_HEAD.match(self.region)
        if match:
            self._response = match.end()
        return match is not None

    def _stream_response(self, events: list) -> None:
        """The generic format's {"response": "..."}: the string's text, unescaped."""
        text, i, out = self.region, self._response, []
        while i < len(text) and not self._response_done:
            ch = text[i]
            if ch == '"':
                self._response_done = True
            elif ch == "\\":
                match = _ESCAPE.match(text, i)
                if match is None:
                    break  # the escape is not complete yet
                out.append(json.loads(f'"{match.group(0)}"'))
                i = match.end()
                continue
            else:
                out.append(ch)
            i += 1
        self._response = i
        if out:
            events.append(Text("".join(out)))

    def _whole_region(self) -> list:
        """The region at the end, when no call head was seen in it: a call whose keys came
        in another order, or else text."""
        body = self.region
        for opener in self.openers:
            body = body.replace(opener, "")
        for closer in ("</tool_call>",):
            body = body.replace(closer, "")
        try:
            data = json.loads(body)
        except ValueError:
            return [Text(self.region)]
        items = data if isinstance(data, list) else [data.get("tool_call", data)] \
            if isinstance(data, dict) else []
        events = []
        for item in items:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                return [Text(self.region)]
            arguments = item.get("arguments", item.get("parameters", {}))
            start = CallStart(len(self.calls), new_call_id(self.id_prefix), item["name"])
            self.calls.append(start)
            events += [start, CallArgs(start.index, json.dumps(arguments))]
        return events


def _tail_starting_any(text: str, openers: tuple[str, ...]) -> int:
    """Length of the longest tail of `text` that begins one of the openers."""
    longest = 0
    for opener in openers:
        for n in range(min(len(opener) - 1, len(text)), longest, -1):
            if text.endswith(opener[:n]):
                longest = n
                break
    return longest
