"""The tool-call forms of chat templates: how a conversation with tools is given to the
model's template, the grammar that makes a forced call well-formed, and how calls are
read back from its output (tool_stream.py).

- hermes: Qwen 2.5/3, Hermes 2/3 and the many templates that copied them:
  `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
- llama3: Llama 3.1-3.3: a bare `{"name": ..., "parameters": {...}}`
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`
- generic: a template that knows no tools (SmolLM2, Gemma 3): the tools are described in
  the system message and the answer is JSON, `{"tool_call": {...}}` or
  `{"response": "..."}`, always under a grammar (as llama.cpp does for such templates).

A native template gets the tools as Hugging Face's `apply_chat_template` passes them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .conversation import Conversation, Message, Tool
from .json_schema import Branch
from .tool_stream import ToolStream

GENERIC_PROMPT = (
    "You can call these tools:\n{tools}\n\n"
    'To call a tool, answer with only {{"tool_call": {{"name": <tool name>, "arguments": '
    '<its arguments>}}}}. To answer the user, answer with only {{"response": <your answer>}}. '
    'A tool\'s result comes back as {{"tool_response": ...}}: then use it to answer the user.'
)


@dataclass(frozen=True)
class ToolFormat:
    name: str
    native: bool             # the template renders tools itself
    before: str = ""         # a call's text around its JSON
    after: str = ""
    arguments_key: str = "arguments"
    array: bool = False      # the calls are one JSON array (mistral)
    openers: tuple[str, ...] = ()
    at_start: tuple[str, ...] = ()

    # -- into the template --------------------------------------------------------------

    def template_input(self, conv: Conversation) -> tuple[list[dict], list[dict] | None]:
        """The messages and tools as the template receives them."""
        offered = conv.tools if conv.choice.mode != "none" else ()
        if self.native:
            tools = [_openai_tool(t) for t in offered] or None
            return [self._native_message(m, conv) for m in conv.messages], tools
        messages = [self._generic_message(m, conv) for m in conv.messages]
        if offered:
            messages = _with_system(messages, GENERIC_PROMPT.format(
                tools="\n".join(json.dumps(_openai_tool(t)["function"]) for t in offered)))
        return messages, None

    def _native_message(self, message: Message, conv: Conversation) -> dict:
        out: dict = {"role": message.role, "content": message.content}
        if message.calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in message.calls]
        if message.role == "tool":
            out["tool_call_id"] = message.call_id
            out["name"] = _call_name(conv, message.call_id)
        return out

    def _generic_message(self, message: Message, conv: Conversation) -> dict:
        if message.role == "tool":
            body = {"tool_response": {"tool": _call_name(conv, message.call_id),
                                      "content": message.content}}
            return {"role": "user", "content": json.dumps(body)}
        if message.calls:
            calls = [{"name": c.name, "arguments": c.arguments} for c in message.calls]
            body = {"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}
            return {"role": message.role, "content": json.dumps(body)}
        return {"role": message.role, "content": message.content}

    # -- the grammar --------------------------------------------------------------------

    def branches(self, conv: Conversation) -> list[Branch] | None:
        """What the output may be; None: free text."""
        mode = conv.choice.mode
        answer = [Branch(conv.schema)] if conv.schema is not None else []
        if mode == "none" or not conv.tools:
            return answer or None
        tools = conv.tools if mode != "function" else \
            tuple(t for t in conv.tools if t.name == conv.choice.name)
        call = self._call_schema(tools)
        if not self.native:
            calls = [Branch({"type": "object", "properties": {"tool_call": call},
                             "required": ["tool_call"]})]
            if mode == "auto":
                text = conv.schema or {"type": "string"}
                calls.append(Branch({"type": "object", "properties": {"response": text},
                                     "required": ["response"]}))
            return calls
        several = mode != "function" and conv.choice.parallel
        if self.array:
            calls = [Branch({"type": "array", "items": call, "minItems": 1,
                             **({} if several else {"maxItems": 1})}, self.before)]
        else:
            calls = [Branch(call, self.before, self.after,
                            repeat=several and bool(self.before))]
        if mode == "auto":
            return calls + answer if answer else None  # free text may call or answer
        return calls

    def _call_schema(self, tools: tuple[Tool, ...]) -> dict:
        alternatives = [{"type": "object",
                         "properties": {"name": {"const": t.name},
                                        self.arguments_key: t.parameters},
                         "required": ["name", self.arguments_key]} for t in tools]
        return alternatives[0] if len(alternatives) == 1 else {"anyOf": alternatives}

    # -- out of the output --------------------------------------------------------------

    def stream(self, conv: Conversation, id_prefix: str = "call_") -> ToolStream | None:
        """The reader of this output; None when it can hold no tool call."""
        if not conv.tools or conv.choice.mode == "none":
            return None
        return ToolStream(self.openers, self.at_start, id_prefix,
                          response_key=not self.native)


HERMES = ToolFormat("hermes", True, "<tool_call>\n", "\n</tool_call>",
                    openers=("<tool_call>",))
LLAMA3 = ToolFormat("llama3", True, arguments_key="parameters",
                    openers=("<|python_tag|>",), at_start=("{",))
MISTRAL = ToolFormat("mistral", True, "[TOOL_CALLS]", array=True,
                     openers=("[TOOL_CALLS]",), at_start=("[{",))
GENERIC = ToolFormat("generic", False, at_start=("{",))


def detect(template: str | None) -> ToolFormat:
    """The form a chat template uses for tool calls, read from its text."""
    text = template or ""
    if "<tool_call>" in text:
        return HERMES
    if "[TOOL_CALLS]" in text:
        return MISTRAL
    if "<|start_header_id|>" in text and "tools" in text:
        return LLAMA3
    return GENERIC


def _openai_tool(tool: Tool) -> dict:
    return {"type": "function", "function": {"name": tool.name, "description": tool.description,
                                             "parameters": tool.parameters}}


def _call_name(conv: Conversation, call_id: str | None) -> str:
    for message in conv.messages:
        for call in message.calls:
            if call.id == call_id:
                return call.name
    return ""


def _with_system(messages: list[dict], text: str) -> list[dict]:
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": f"{messages[0]['content']}\n\n{text}"},
                *messages[1:]]
    return [{"role": "system", "content": text}, *messages]
