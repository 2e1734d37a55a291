"""One shape for a conversation with tools, whichever API it came through (OpenAI chat,
Anthropic Messages, Responses): messages, tools and the tool choice, each message
remembering where it was in the request so errors can name the field."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property

from ..errors import InvalidRequest
from ..kept import Kept
from .images import Picture
from .json_schema import bounded, check


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: dict


@dataclass(frozen=True)
class Message:
    role: str  # "system", "user", "assistant" or "tool"
    content: str = ""
    calls: tuple[ToolCall, ...] = ()  # an assistant's tool calls
    call_id: str | None = None        # a tool result: the call it answers
    where: str = "messages"           # its place in the request, for errors
    reasoning: str = ""               # an assistant's reasoning, for templates that keep it
    pictures: tuple[Picture, ...] = ()  # its images, in the order of MARKER in `content`


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict
    unenforced: tuple[str, ...] = ()  # schema keywords the grammar leaves out (reported)
    key: tuple | None = field(default=None, compare=False, repr=False)  # KnownTools'


@dataclass(frozen=True)
class Choice:
    """What the model may do with its tools: "auto", "none", "required", or call the
    function `name`."""
    mode: str = "auto"
    name: str | None = None
    parallel: bool = True  # "required" may make several calls in one answer


@dataclass(frozen=True)
class Conversation:
    messages: tuple[Message, ...]
    tools: tuple[Tool, ...] = ()
    choice: Choice = field(default_factory=Choice)
    schema: dict | None = None  # the answer's JSON Schema (response_format)

    @cached_property
    def call_names(self) -> dict[str, str]:
        """Each earlier call's name by its id, built once (a tool result's name is looked
        up per message: a scan each was quadratic in a conversation's calls)."""
        return {call.id: call.name for m in self.messages for call in m.calls}

    def notes(self) -> list[str]:
        """What the answer should know: tool schema keywords no grammar enforces."""
        places = [p for t in self.tools for p in t.unenforced]
        return [f"not enforced in tool calls (the grammar cannot): {', '.join(places)}"] \
            if places and self.choice.mode != "none" else []


# Checked tools kept by their text, bounded in bytes (kept.py). A kept tool's parsed
# schema takes about six times its JSON text in Python objects (measured on agents'
# tools), so it is charged so; a schema over TOOL_KEPT_MAX is checked each time.
TOOLS_KEPT_BYTES = 32 << 20
TOOL_KEPT_MAX = 256 << 10
_WEIGHT = 6


class KnownTools:
    """Tools already checked (an agent sends the same 20-odd on every turn: checking them
    was 8 ms of a 12k-token turn's 45). A tool is looked up here when a request is read
    but kept only once its request has started (`remember`): nothing is kept for a
    request that fails (a 404 model, a 400 elsewhere). Errors are never kept."""

    def __init__(self, budget: int = TOOLS_KEPT_BYTES):
        self.kept: Kept[Tool] = Kept(budget, TOOL_KEPT_MAX * _WEIGHT)

    def get(self, key: tuple) -> Tool | None:
        return self.kept.get(key)

    def remember(self, tools) -> None:
        for t in tools:
            if t.key is not None:
                self.kept.put(t.key, t, _WEIGHT * sum(len(part) for part in t.key))


known_tools = KnownTools()


def tool(name: str, description: str | None, parameters: dict | None, where: str) -> Tool:
    """A function tool, its parameters checked as JSON Schema; keywords the grammar cannot
    enforce are kept aside to be reported."""
    parameters = parameters if parameters is not None else {"type": "object", "properties": {}}
    try:
        schema = json.dumps(parameters)  # its order kept: the model reads it in order
    except (TypeError, ValueError, RecursionError):  # check names what is wrong
        return _checked_tool(name, description or "", parameters, where)
    key = (name, description or "", schema, where)
    found = known_tools.get(key)
    if found is not None:
        return found
    made = _checked_tool(name, description or "", parameters, where)
    return replace(made, key=key) if len(schema) <= TOOL_KEPT_MAX else made


def _checked_tool(name: str, description: str, parameters, where: str) -> Tool:
    parameters, loosened = bounded(parameters, where)
    return Tool(name, description, parameters,
                tuple(loosened + check(parameters, where, strict=False)))


def checked(conversation: Conversation, choice_param: str) -> Conversation:
    """Refuses what cannot work: a named choice that is not among the tools, a choice
    that needs tools without any, a tool result that answers no earlier call."""
    choice, names = conversation.choice, {t.name for t in conversation.tools}
    if len(names) != len(conversation.tools):
        raise InvalidRequest("two tools have the same name", param="tools")
    if choice.mode == "function" and choice.name not in names:
        raise InvalidRequest(f"tool_choice names {choice.name!r}, which is not among the "
                             f"tools ({', '.join(sorted(names)) or 'none given'})",
                             param=choice_param)
    if choice.mode == "required" and not names:
        raise InvalidRequest("tool_choice 'required' needs at least one tool",
                             param=choice_param)
    calls: set[str] = set()
    for message in conversation.messages:
        calls.update(call.id for call in message.calls)
        if message.role == "tool" and message.call_id not in calls:
            raise InvalidRequest(f"the tool result for {message.call_id!r} answers no earlier "
                                 "tool call", param=message.where)
    return conversation
