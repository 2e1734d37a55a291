"""Anthropic's Messages API: /v1/messages (with tools and its streaming events) and
/v1/messages/count_tokens, for clients such as Claude Code (ANTHROPIC_BASE_URL)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from functools import partial
import json
import uuid
from typing import Any, AsyncIterator, Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ...conversation.conversation import Choice, Conversation, Message, ToolCall, tool
from ...formats.parsed import CallArgs, CallStart, Reasoning, Text
from ...engine import Engine
from ...errors import HomerackError, InvalidRequest
from ..schemas import Groundable, SamplingFields, content_of, text_of
from ..thinking import Thinking
from ..turns import Done, conversation_turn, guarded
from ..side_work import turn_work
from ..wire import Caller, anthropic_error, cited, device_of, extension

_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use",
                 "cancelled": "end_turn"}
_SKIPPED = ("redacted_thinking",)  # another service's encrypted reasoning: nothing to show


class AnthropicTool(BaseModel):
    model_config = ConfigDict(extra="ignore")
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    type: str | None = None


class AnthropicChoice(BaseModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="ignore")
    # "system" among the messages: Claude Code sends its reminders so (after the first
    # user turn); see `conversation`
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]


class ThinkingConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(None, ge=1)


class MessagesRequest(SamplingFields, Groundable):
    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1)
    system: str | list[dict[str, Any]] | None = None
    stop_sequences: list[str] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicChoice | None = None
    thinking: ThinkingConfig | None = None

    def token_limit(self) -> int | None:
        return self.max_tokens

    def reasoning(self) -> Thinking:
        """Thinking disabled asks the model not to reason (where its template can);
        otherwise its reasoning comes back as thinking blocks."""
        if self.thinking is None:
            return Thinking()
        return Thinking(effort="none" if self.thinking.type == "disabled" else None,
                        budget=self.thinking.budget_tokens)

    def stop_strings(self) -> tuple[str, ...]:
        return tuple(self.stop_sequences or ())


class CountRequest(MessagesRequest):
    max_tokens: int = 1


def conversation(body: MessagesRequest) -> Conversation:
    """The request as a conversation. A system message among the messages (Claude Code's
    list of agents, its reminders) joins the system prompt while no user turn came before
    it, and afterwards the user turn before it (or after it, when an answer came between):
    most models' templates take one system prompt, at the top, and turns that alternate;
    and left where it was sent, it keeps the prefix before it the same from turn to turn
    (the prompt cache reuses it)."""
    systems = [text_of(body.system, "system")] if body.system else []
    messages: list[Message] = []
    held: list[str] = []  # system texts waiting for the next user turn
    tail: list[str] = []  # system texts joining the user turn just before them
    seen_user = False
    for i, message in enumerate(body.messages):
        where = f"messages[{i}]"
        if message.role == "system":
            text = text_of(message.content, f"{where}.content")
            if not seen_user:
                systems.append(text)
            elif messages[-1].role == "user":
                tail.append(text)
            else:
                held.append(text)
            continue
        _join_tail(messages, tail)
        turn = _messages(message, where)
        if held and message.role == "user" and turn and turn[-1].role == "user":
            turn[-1] = replace(turn[-1], content="\n\n".join([*held, turn[-1].content]))
            held = []
        messages += turn
        seen_user = seen_user or any(m.role == "user" for m in turn)
    _join_tail(messages, tail)
    if held:
        messages.append(Message("user", "\n\n".join(held), where="messages"))
    if systems:
        messages.insert(0, Message("system", "\n\n".join(systems), where="system"))
    tools = []
    for i, t in enumerate(body.tools or ()):
        if t.type not in (None, "custom") or t.input_schema is None:
            raise InvalidRequest(f"tools[{i}]: only custom tools with an input_schema are "
                                 f"supported (not {t.type or 'a tool without input_schema'})",
                                 param=f"tools[{i}]")
        tools.append(tool(t.name, t.description, t.input_schema, f"tools[{i}].input_schema"))
    return Conversation(tuple(messages), tuple(tools), _choice(body.tool_choice))


def _join_tail(messages: list[Message], tail: list[str]) -> None:
    """The system texts sent after the last user turn, joined to it once (appended one
    by one, each copy of the text was quadratic in their number)."""
    if tail:
        last = messages[-1]
        messages[-1] = replace(last, content="\n\n".join([last.content, *tail]))
        tail.clear()


def _choice(choice: AnthropicChoice | None) -> Choice:
    if choice is None:
        return Choice()
    parallel = not choice.disable_parallel_tool_use
    mode = {"auto": "auto", "any": "required", "none": "none", "tool": "function"}[choice.type]
    if mode == "function" and not choice.name:
        raise InvalidRequest("tool_choice of type tool needs a name", param="tool_choice.name")
    return Choice(mode, choice.name, parallel)


def _messages(message: AnthropicMessage, where: str) -> list[Message]:
    """One Anthropic message: its tool results become tool messages, its tool_use blocks
    the assistant's calls."""
    if isinstance(message.content, str):
        return [Message(message.role, message.content, where=where)]
    text, thoughts, calls, results, pictures = [], [], [], [], []
    for j, block in enumerate(message.content):
        kind, at = block.get("type"), f"{where}.content[{j}]"
        if kind == "text":
            text.append(str(block.get("text", "")))
        elif kind == "image" and message.role == "user":
            part, found = content_of([block], f"{where}.content", ("text",))
            text.append(part)
            pictures += found
        elif kind == "thinking" and message.role == "assistant":
            thoughts.append(str(block.get("thinking", "")))
        elif kind == "tool_use" and message.role == "assistant":
            calls.append(ToolCall(str(block.get("id")), str(block.get("name")),
                                  block.get("input") or {}))
        elif kind == "tool_result" and message.role == "user":
            content = text_of(block.get("content"), f"{at}.content")
            if block.get("is_error"):
                content = f"Error: {content}"
            results.append(Message("tool", content, call_id=block.get("tool_use_id"),
                                   where=f"{at}.tool_use_id"))
        elif kind not in _SKIPPED:
            raise InvalidRequest(f"{at}: content of type {kind!r} is not supported here",
                                 param=at)
    out = results
    if text or calls or thoughts:
        out.append(Message(message.role, "".join(text), tuple(calls), where=where,
                           reasoning="".join(thoughts), pictures=tuple(pictures)))
    return out


def router(engine: Engine) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/messages")
    async def messages(body: MessagesRequest, http: Request):
        caller = Caller.of(http)
        turn = await turn_work(engine, caller, conversation_turn, engine, body,
                               partial(conversation, body), caller, "tool_choice", "toolu_",
                               body.reasoning())
        try:
            started = await turn.start()
        except asyncio.CancelledError:
            return JSONResponse(anthropic_error(499, "client disconnected"), 499)
        message_id = f"msg_{uuid.uuid4().hex[:24]}"
        head = {"id": message_id, "type": "message", "role": "assistant",
                "model": started.model, "stop_sequence": None, **cited(turn)}
        if body.stream:
            return StreamingResponse(_events(turn, head, started),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            got = await turn.collect()
        except asyncio.CancelledError:
            return JSONResponse(anthropic_error(499, "client disconnected"), 499)
        content = [{"type": "thinking", "thinking": got.reasoning, "signature": ""}] \
            if got.reasoning else []
        content += [{"type": "text", "text": got.text}] if got.text or not got.calls else []
        content += [{"type": "tool_use", "id": start.id, "name": start.name,
                     "input": _input(args)} for start, args in got.calls]
        return {**head, "content": content, "stop_reason": _STOP_REASONS[got.done.reason],
                "usage": _usage(got.done.usage), "homerack": extension(started, turn.notes)}

    @api.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountRequest, http: Request):
        def count() -> int:  # reads the model's vocabulary: not on the event loop
            turn = conversation_turn(engine, body, conversation(body), Caller.of(http))
            with engine.home.working(device_of(http), turn.request.model.id):
                return engine.count_prompt_tokens(turn.request)
        return {"input_tokens": await asyncio.to_thread(count)}

    return api


def _input(args: str) -> dict:
    try:
        value = json.loads(args or "{}")
    except ValueError:
        return {"_unparsed_arguments": args}
    return value if isinstance(value, dict) else {"value": value}


def _usage(usage) -> dict:
    return {**_input_usage(usage.prompt_tokens, usage.cached_tokens),
            "output_tokens": usage.completion_tokens}


def _input_usage(prompt_tokens: int, cached_tokens: int) -> dict:
    """A prompt's tokens as Anthropic counts them: those read from the cache apart from
    the rest (input_tokens), their sum the whole prompt (what count_tokens says). Claude
    Code reads them from the stream's message_start."""
    return {"input_tokens": prompt_tokens - cached_tokens,
            "cache_read_input_tokens": cached_tokens, "cache_creation_input_tokens": 0}


def _event(kind: str, data: dict) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n"


def _error_event(error: HomerackError) -> str:
    return _event("error", {"error": anthropic_error(error.status, error.message,
                                                error.param)["error"]})


async def _events(turn, head: dict, started) -> AsyncIterator[str]:
    yield _event("message_start", {"message": {
        **head, "content": [], "stop_reason": None,
        "usage": {**_input_usage(started.prompt_tokens, started.cached_tokens),
                  "output_tokens": 0}}})
    index, open_kind = -1, None  # the content block being written

    def start_block(block: dict):
        nonlocal index, open_kind
        out = [_event("content_block_stop", {"index": index})] if open_kind else []
        index += 1
        open_kind = block["type"]
        return out + [_event("content_block_start", {"index": index, "content_block": block})]

    async for part in guarded(turn, _error_event):
        if isinstance(part, str):
            yield part
            return
        if isinstance(part, Reasoning):
            if open_kind != "thinking":
                for line in start_block({"type": "thinking", "thinking": "", "signature": ""}):
                    yield line
            yield _event("content_block_delta", {"index": index, "delta": {
                "type": "thinking_delta", "thinking": part.text}})
        elif isinstance(part, Text) and part.text:
            if open_kind != "text":
                for line in start_block({"type": "text", "text": ""}):
                    yield line
            yield _event("content_block_delta", {"index": index, "delta": {
                "type": "text_delta", "text": part.text}})
        elif isinstance(part, CallStart):
            for line in start_block({"type": "tool_use", "id": part.id, "name": part.name,
                                     "input": {}}):
                yield line
        elif isinstance(part, CallArgs):
            yield _event("content_block_delta", {"index": index, "delta": {
                "type": "input_json_delta", "partial_json": part.text}})
        elif isinstance(part, Done):
            if open_kind == "thinking":
                yield _event("content_block_delta", {"index": index, "delta": {
                    "type": "signature_delta", "signature": ""}})
            if open_kind:
                yield _event("content_block_stop", {"index": index})
            yield _event("message_delta", {
                "delta": {"stop_reason": _STOP_REASONS[part.reason], "stop_sequence": None},
                "usage": {"output_tokens": part.usage.completion_tokens}})
            yield _event("message_stop", {})
