"""The ways models write tool calls, each read from a whole or a partial answer into the
text before the calls and the calls themselves (`split`).

- `JsonCalls`: objects {"name": ..., "arguments": {...}} after an opener (Hermes'
  `<tool_call>`, Mistral Nemo's `[TOOL_CALLS]`, Nemotron's `<TOOLCALL>`, Granite's and
  Phi-4's `<|tool_call|>`, Command-R7B's `<|START_ACTION|>`, firefunction's `functools`),
  or as the answer's first characters (Llama 3.x).
- `NamedCalls`: a head naming the function, then its arguments' JSON (functionary v3.1
  `<function=NAME>`, Mistral Small 3.2 `[TOOL_CALLS]NAME[ARGS]`, DeepSeek, Kimi K2).
- `XmlCalls`: parameters one by one as text (Qwen3-Coder, Seed-OSS, MiniMax-M2, GLM-4.5,
  DeepSeek V3.2's DSML); typed by the tool's schema.
- `PythonCalls`: `[name(arg=1, b="x")]` (LFM2).

A partial answer yields only what can no longer change: a call's name once complete, its
arguments as a prefix of their final text; a tail that may begin a marker is held back.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass

from .parsed import ParsedCall
from .scan import first, json_end, typed, unescaped_prefix, without, without_held

Schemas = dict  # tool name -> its parameters' JSON Schema

CALL_HEAD = re.compile(
    r'\{\s*(?:"(?:id|tool_call_id)"\s*:\s*"[^"]*"\s*,\s*)?"(?:name|tool_name)"\s*:\s*'
    r'"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*')
TRAILING_ID = re.compile(r'\s*,\s*"id"\s*:\s*"([^"]*)"')
RESPONSE_HEAD = re.compile(r'\s*\{\s*"response"\s*:\s*"')


@dataclass(frozen=True)
class JsonCalls:
    openers: tuple[str, ...] = ()
    at_start: tuple[str, ...] = ()  # a region only as the answer's first characters
    response_key: bool = False  # the generic form: {"response": "..."} is the answer

    def markers(self) -> tuple[str, ...]:
        return self.openers

    def split(self, text: str, partial: bool, schemas: Schemas) -> tuple[str, tuple]:
        start = self._region(text, partial)
        if start is None:
            return without_held(text, self.openers, partial), ()
        region = text[start:]
        if self.response_key and (head := RESPONSE_HEAD.match(region)):
            return unescaped_prefix(region, head.end())[0], ()
        calls = _json_calls(region, partial)
        if not partial and not calls:  # keys in another order, or Llama's built-in tools
            calls = _whole(region, self.openers) or _builtin(region, self.openers)
        return _answer(text, start, calls, partial)

    def _region(self, text: str, partial: bool) -> int | None:
        stripped = text.lstrip()
        lead = len(text) - len(stripped)
        for opener in self.at_start:
            if stripped.startswith(opener) or (partial and opener.startswith(stripped)):
                return lead
        found = first(text, self.openers)
        return found[0] if found else None


def _json_calls(region: str, partial: bool) -> tuple[ParsedCall, ...]:
    calls, cursor = [], 0
    while (head := CALL_HEAD.search(region, cursor)) is not None:
        span = json_end(region, head.end())
        name = json.loads(f'"{head.group(1)}"')
        if span is None:
            if partial:
                calls.append(ParsedCall(name, ""))
            break
        begin, end = span
        if end is None:
            calls.append(ParsedCall(name, region[begin:]))
            break
        own = TRAILING_ID.match(region, end)
        calls.append(ParsedCall(name, region[begin:end], own.group(1) if own else None))
        cursor = end
    return tuple(calls)


def _whole(region: str, openers: tuple[str, ...]) -> tuple[ParsedCall, ...] | None:
    """A finished region whose calls no head matched: keys in another order, or wrapped
    ({"tool_call": ...}); None when it holds no call."""
    body = without(region, (*openers, "</tool_call>", "</TOOLCALL>", "<|/tool_call|>",
                             "</tool_calls>", "<|END_ACTION|>"))
    try:
        data = json.loads(body)
    except ValueError:
        return None
    if isinstance(data, dict):
        data = data.get("tool_calls", [data.get("tool_call", data)])
    items = data if isinstance(data, list) else []
    calls = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            return None
        arguments = item.get("arguments", item.get("parameters", {}))
        calls.append(ParsedCall(item["name"], json.dumps(arguments)))
    return tuple(calls) or None


def _builtin(region: str, openers: tuple[str, ...]) -> tuple[ParsedCall, ...]:
    """Llama 3.1's built-in tools after <|python_tag|>: `brave_search.call(query="...")`
    is a call of `brave_search`."""
    calls = []
    for call in _python_calls(without(region, openers).strip()):
        if call.name.endswith(".call"):
            calls.append(ParsedCall(call.name.removesuffix(".call"), call.arguments))
    return tuple(calls)


@dataclass(frozen=True)
class NamedCalls:
    leads: tuple[str, ...]  # where the calls begin: the text before them is the content
    head: re.Pattern        # one call's head: groups "name" (and "id")
    preamble: str = ""      # functionary v3.2: its first call comes without ">>>"

    def markers(self) -> tuple[str, ...]:
        return self.leads

    def split(self, text: str, partial: bool, schemas: Schemas) -> tuple[str, tuple]:
        if self.preamble:
            text = self._functionary(text, partial, schemas)
            if text is None:
                return "", ()
        found = first(text, self.leads)
        if found is None:
            return without_held(text, self.leads, partial), ()
        calls, cursor = [], found[0]
        while (head := self.head.search(text, cursor)) is not None:
            span = json_end(text, head.end())
            name = head.group("name").strip()
            own = head.groupdict().get("id")
            if span is None or span[1] is None:
                calls.append(ParsedCall(name, text[span[0]:] if span else "", own))
                break
            calls.append(ParsedCall(name, text[span[0]:span[1]], own))
            cursor = span[1]
        return _answer(text, found[0], calls, partial)

    def _functionary(self, text: str, partial: bool, schemas: Schemas) -> str | None:
        """v3.2 starts with "all\\n" (then text) or a function's name (then its call)."""
        if "\n" not in text:
            return None if partial else text
        first_line, rest = text.split("\n", 1)
        if first_line == "all":
            return rest
        return self.preamble + text if first_line in schemas else text


@dataclass(frozen=True)
class XmlCalls:
    leads: tuple[str, ...]
    head: re.Pattern   # group "name"
    param: re.Pattern  # groups "key", "value"
    end: str           # closes one call

    def markers(self) -> tuple[str, ...]:
        return self.leads

    def split(self, text: str, partial: bool, schemas: Schemas) -> tuple[str, tuple]:
        found = first(text, self.leads)
        if found is None:
            return without_held(text, self.leads, partial), ()
        calls, cursor = [], found[0]
        while (head := self.head.search(text, cursor)) is not None:
            name = head.group("name").strip()
            close = text.find(self.end, head.end())
            body = text[head.end():close if close >= 0 else len(text)]
            properties = (schemas.get(name) or {}).get("properties", {})
            pairs = [f"{json.dumps(m.group('key').strip())}: "
                     f"{json.dumps(typed(_unpad(m.group('value')), properties.get(m.group('key').strip())))}"
                     for m in self.param.finditer(body)]
            arguments = "{" + ", ".join(pairs)
            complete = close >= 0 or not partial
            calls.append(ParsedCall(name, arguments + "}" if complete else arguments))
            if close < 0:
                break
            cursor = close + len(self.end)
        return _answer(text, found[0], calls, partial)


def _answer(text: str, start: int, calls: list, partial: bool) -> tuple[str, tuple]:
    """The text before the calls and the calls; a finished answer whose call region held
    no call is all text."""
    if not partial and not calls:
        return text, ()
    return text[:start], tuple(calls)


def _unpad(value: str) -> str:
    """Qwen3-Coder writes a value on lines of its own."""
    value = value[1:] if value.startswith("\n") else value
    return value[:-1] if value.endswith("\n") else value


@dataclass(frozen=True)
class PythonCalls:
    opener: str
    closer: str

    def markers(self) -> tuple[str, ...]:
        return (self.opener,)

    def split(self, text: str, partial: bool, schemas: Schemas) -> tuple[str, tuple]:
        at = text.find(self.opener)
        if at < 0:
            return without_held(text, (self.opener,), partial), ()
        calls, cursor = [], at
        while (at_call := text.find(self.opener, cursor)) >= 0:
            end = text.find(self.closer, at_call)
            if end < 0 and partial:
                break
            source = text[at_call + len(self.opener):end if end >= 0 else len(text)]
            calls += _python_calls(source)
            if end < 0:
                break
            cursor = end + len(self.closer)
        return _answer(text, at, calls, partial)


def _python_calls(source: str) -> list[ParsedCall]:
    """`[f(a=1), g(b="x")]` as calls; nothing from what does not parse as such."""
    try:
        tree = ast.parse(source.strip(), mode="eval").body
    except SyntaxError:
        return []
    items = tree.elts if isinstance(tree, (ast.List, ast.Tuple)) else [tree]
    calls = []
    for item in items:
        if not isinstance(item, ast.Call) or not isinstance(item.func, (ast.Name, ast.Attribute)):
            continue
        try:
            arguments = {k.arg: ast.literal_eval(k.value) for k in item.keywords if k.arg}
        except ValueError:
            continue
        calls.append(ParsedCall(ast.unparse(item.func), json.dumps(arguments)))
    return calls
