"""A conversation made ready for the engine: the messages and tools its template takes,
the grammar its output must follow, and how its output is read (engine/formats)."""

from __future__ import annotations

from dataclasses import dataclass

from ..formats.families import Family
from ..formats.stream import Reading
from .conversation import Conversation
from .json_schema import grammar
from .tool_formats import branches, template_input


@dataclass(frozen=True)
class Composed:
    messages: tuple[dict, ...]
    tools: tuple[dict, ...] | None
    grammar: str | None
    reading: Reading
    notes: tuple[str, ...] = ()


def compose(conv: Conversation, family: Family, *, separate: bool = True,
            id_prefix: str = "call_", param: str = "tools") -> Composed:
    messages, tools = template_input(family, conv)
    ways, notes = branches(family, conv)
    gbnf = grammar(ways, param, thinking=family.think if separate else None) if ways else None
    offered = conv.tools if conv.choice.mode != "none" else ()
    schemas = {t.name: t.parameters for t in offered} if offered else None
    return Composed(tuple(messages), tuple(tools) if tools else None, gbnf,
                    Reading(family, schemas, separate, id_prefix=id_prefix), tuple(notes))
