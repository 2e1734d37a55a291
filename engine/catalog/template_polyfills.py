"""What a chat template lacks, supplied the way llama.cpp's template engine does, each a
pure rewrite of the messages: tried in turn, one more at a time, until the template
renders (chat_format.render).

- Mistral's templates take only 9-character alphanumeric tool-call ids;
- functionary's want a call's arguments as a JSON string, not an object;
- Gemma 2 has no system role: the system text opens the first user turn;
- templates without a tool role see results as user turns, and past calls as text;
- Command-R+ reads a tool's name and description at its top level, not in "function".

Each rewrite takes and gives (messages, tools)."""

from __future__ import annotations

import hashlib
import json


def nine_character_ids(messages: list[dict]) -> list[dict]:
    def short(call_id: str) -> str:
        if len(call_id) == 9 and call_id.isalnum():
            return call_id
        return hashlib.sha256(call_id.encode()).hexdigest()[:9]

    out = []
    for message in messages:
        message = dict(message)
        if message.get("tool_calls"):
            message["tool_calls"] = [{**call, "id": short(call["id"])}
                                     for call in message["tool_calls"]]
        if message.get("tool_call_id"):
            message["tool_call_id"] = short(message["tool_call_id"])
        out.append(message)
    return out


def arguments_as_text(messages: list[dict]) -> list[dict]:
    out = []
    for message in messages:
        if message.get("tool_calls"):
            message = {**message, "tool_calls": [
                {**call, "function": {**call["function"],
                                      "arguments": json.dumps(call["function"]["arguments"])}}
                for call in message["tool_calls"]]}
        out.append(message)
    return out


def system_in_first_user(messages: list[dict]) -> list[dict]:
    if not messages or messages[0]["role"] != "system":
        return messages
    system, rest = messages[0]["content"], list(messages[1:])
    for i, message in enumerate(rest):
        if message["role"] == "user":
            rest[i] = {**message, "content": f"{system}\n\n{message['content']}"}
            return rest
    return [{"role": "user", "content": system}, *rest]


def tools_as_text(messages: list[dict]) -> list[dict]:
    out = []
    for message in messages:
        if message["role"] == "tool":
            body = {"tool_response": {"tool": message.get("name", ""),
                                      "content": message["content"]}}
            message = {"role": "user", "content": json.dumps(body)}
        elif message.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                     for c in message["tool_calls"]]
            text = json.dumps({"tool_calls": calls})
            message = {"role": message["role"],
                       "content": f"{message['content']}\n{text}".strip()}
        out.append(_merged(out, message))
    return [m for m in out if m is not None]


def _merged(out: list, message: dict) -> dict | None:
    """A user turn after a user turn joins it (templates insist the roles alternate)."""
    if out and out[-1] is not None and out[-1]["role"] == message["role"] == "user":
        out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n\n{message['content']}"}
        return None
    return message


def flat_tools(tools: list[dict] | None) -> list[dict] | None:
    """Each tool's function at its top level too, its parameters also as Cohere's
    parameter_definitions (each with a type, a description and whether it is required)."""
    if not tools:
        return tools
    out = []
    for tool in tools:
        function = tool.get("function", {})
        schema = function.get("parameters") or {}
        required = set(schema.get("required", ()))
        definitions = {name: {"type": str(spec.get("type", "string")),
                              "description": str(spec.get("description", "")),
                              "required": name in required}
                       for name, spec in (schema.get("properties") or {}).items()}
        out.append({**function, **tool, "parameter_definitions": definitions})
    return out


def _on_messages(rewrite):
    return lambda messages, tools: (rewrite(messages), tools)


LADDER = (*(_on_messages(f) for f in (nine_character_ids, arguments_as_text,
                                      system_in_first_user, tools_as_text)),
          lambda messages, tools: (messages, flat_tools(tools)))
