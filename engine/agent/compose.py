"""A conversation made ready for the engine: the messages and tools its template takes,
the grammar its output must follow, and the reader of that output."""

from __future__ import annotations

from dataclasses import dataclass

from .conversation import Conversation
from .json_schema import grammar
from .tool_formats import ToolFormat, detect
from .tool_stream import ToolStream


@dataclass(frozen=True)
class Composed:
    messages: tuple[dict, ...]
    tools: tuple[dict, ...] | None
    grammar: str | None
    format: ToolFormat

    def reader(self, conv: Conversation, id_prefix: str = "call_") -> ToolStream | None:
        return self.format.stream(conv, id_prefix)


def compose(conv: Conversation, template: str | None, param: str = "tools") -> Composed:
    fmt = detect(template)
    messages, tools = fmt.template_input(conv)
    branches = fmt.branches(conv)
    gbnf = grammar(branches, param) if branches else None
    return Composed(tuple(messages), tuple(tools) if tools else None, gbnf, fmt)
