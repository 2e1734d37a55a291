"""A conversation made ready for the engine: the messages and tools its template takes,
the branches its output must follow (llama/grammar.py makes them a grammar), and how its
output is read (engine/formats)."""

from __future__ import annotations

from dataclasses import dataclass

from ..formats.families import Family
from ..formats.stream import Reading
from .conversation import Conversation
from .json_schema import Branch
from .tool_formats import branches, template_input


@dataclass(frozen=True)
class Composed:
    messages: tuple[dict, ...]
    tools: tuple[dict, ...] | None
    branches: tuple[Branch, ...]  # none: the output is free
    thinking: tuple[str, str] | None  # the reasoning markers the grammar lets through first
    reading: Reading
    notes: tuple[str, ...] = ()


def compose(conv: Conversation, family: Family, *, separate: bool = True,
            id_prefix: str = "call_") -> Composed:
    messages, tools = template_input(family, conv)
    ways, notes = branches(family, conv)
    offered = conv.tools if conv.choice.mode != "none" else ()
    schemas = {t.name: t.parameters for t in offered} if offered else None
    return Composed(tuple(messages), tuple(tools) if tools else None, tuple(ways or ()),
                    family.think if separate else None,
                    Reading(family, schemas, separate, id_prefix=id_prefix), tuple(notes))
