"""A conversation with tools given to a model in its family's form (engine/formats):
the messages and tools its template takes, and the grammar that makes a forced call
well-formed in the family's own syntax.

A family whose template renders tools (native) gets them as Hugging Face's
`apply_chat_template` passes them, past calls and results included. A template that
knows no tools (SmolLM2, Gemma 3) gets them described in the system message, and the
answer is JSON, `{"tool_call": {...}}` or `{"response": "..."}`, always under a grammar
(as llama.cpp does for such templates).
"""

from __future__ import annotations

import json

from ..formats.families import Family
from .conversation import Conversation, Message, Tool
from .json_schema import Branch

GENERIC_PROMPT = (
    "You can call these tools:\n{tools}\n\n"
    'To call a tool, answer with only {{"tool_call": {{"name": <tool name>, "arguments": '
    '<its arguments>}}}}. To answer the user, answer with only {{"response": <your answer>}}. '
    'A tool\'s result comes back as {{"tool_response": ...}}: then use it to answer the user.'
)


# -- into the template --------------------------------------------------------------------

def template_input(family: Family, conv: Conversation) -> tuple[list[dict], list[dict] | None]:
    """The messages and tools as the template receives them."""
    offered = conv.tools if conv.choice.mode != "none" else ()
    if family.native:
        tools = [_openai_tool(t) for t in offered] or None
        return [_native_message(m, conv) for m in conv.messages], tools
    messages = [_generic_message(m, conv) for m in conv.messages]
    if offered:
        messages = _with_system(messages, GENERIC_PROMPT.format(
            tools="\n".join(json.dumps(_openai_tool(t)["function"]) for t in offered)))
    return messages, None


def _native_message(message: Message, conv: Conversation) -> dict:
    out: dict = {"role": message.role, "content": message.content}
    if message.reasoning:  # templates read one or the other (Qwen3, DeepSeek: the first)
        out["reasoning_content"] = out["thinking"] = message.reasoning
    if message.calls:
        out["tool_calls"] = [{"id": c.id, "type": "function",
                              "function": {"name": c.name, "arguments": c.arguments}}
                             for c in message.calls]
    if message.role == "tool":
        out["tool_call_id"] = message.call_id
        out["name"] = conv.call_names.get(message.call_id, "")
    return out


def _generic_message(message: Message, conv: Conversation) -> dict:
    if message.role == "tool":
        body = {"tool_response": {"tool": conv.call_names.get(message.call_id, ""),
                                  "content": message.content}}
        return {"role": "user", "content": json.dumps(body)}
    if message.calls:
        calls = [{"name": c.name, "arguments": c.arguments} for c in message.calls]
        body = {"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}
        return {"role": message.role, "content": json.dumps(body)}
    return {"role": message.role, "content": message.content}


# -- the grammar --------------------------------------------------------------------------

def branches(family: Family, conv: Conversation) -> tuple[list[Branch] | None, list[str]]:
    """What the output may be (None: free text), and notes on what no grammar enforces."""
    mode = conv.choice.mode
    answer = [Branch(conv.schema)] if conv.schema is not None else []
    if mode == "none" or not conv.tools:
        return answer or None, []
    tools = conv.tools if mode != "function" else \
        tuple(t for t in conv.tools if t.name == conv.choice.name)
    if not family.native:
        return _generic_branches(tools, mode, conv.schema), []
    if mode == "auto":
        return (_native_branches(family, tools, True) + answer if answer else None), []
    forced = _native_branches(family, tools, mode != "function" and conv.choice.parallel)
    if not forced:
        return answer or None, [f"tool_choice {mode!r}: not enforced by a grammar for the "
                                f"{family.name} call syntax; the model was asked to call"]
    return forced, []


def _generic_branches(tools: tuple[Tool, ...], mode: str, schema: dict | None) -> list[Branch]:
    calls = [Branch({"type": "object", "properties": {"tool_call": _call_schema(tools)},
                     "required": ["tool_call"]})]
    if mode == "auto":
        text = schema or {"type": "string"}
        calls.append(Branch({"type": "object", "properties": {"response": text},
                             "required": ["response"]}))
    return calls


def _native_branches(family: Family, tools: tuple[Tool, ...], several: bool) -> list[Branch]:
    forced = family.forced
    if forced is None:
        return []
    several = several and forced.several
    if forced.named:
        return [Branch(t.parameters, forced.before.format(name=t.name), forced.after,
                       repeat=several) for t in tools]
    call = _call_schema(tools, forced.arguments_key, forced.name_key)
    if forced.array:
        return [Branch({"type": "array", "items": call, "minItems": 1,
                        **({} if several else {"maxItems": 1})}, forced.before, forced.after)]
    return [Branch(call, forced.before, forced.after, repeat=several and bool(forced.before))]


def _call_schema(tools: tuple[Tool, ...], arguments_key: str = "arguments",
                 name_key: str = "name") -> dict:
    alternatives = [{"type": "object",
                     "properties": {name_key: {"const": t.name}, arguments_key: t.parameters},
                     "required": [name_key, arguments_key]} for t in tools]
    return alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}


def _openai_tool(tool: Tool) -> dict:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.parameters}}


def _with_system(messages: list[dict], text: str) -> list[dict]:
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"},
                *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
