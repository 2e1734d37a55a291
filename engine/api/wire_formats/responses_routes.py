"""OpenAI's Responses API, stateless: /v1/responses with input items, instructions,
function tools, text.format and its streaming events (what Codex's
`wire_api = "responses"` speaks). A previous_response_id is refused: nothing is stored."""

from __future__ import annotations

import asyncio
from functools import partial
import json
from dataclasses import replace
import time
import uuid
from typing import Any, AsyncIterator, Literal

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from ...conversation.conversation import Choice, Conversation, Message, ToolCall, tool
from ...conversation.json_schema import check
from ...formats.parsed import CallArgs, CallStart, Reasoning, Text
from ...engine import Engine
from ...errors import Forbidden, HomerackError, InvalidRequest
from . import mcp_responses
from ..schemas import Groundable, SamplingFields, content_of, text_of
from ..thinking import Thinking
from ..turns import Done, Turn, conversation_turn, guarded
from ..side_work import turn_work
from ..wire import Caller, cancelled, cited, extension

_TEXT_PARTS = ("input_text", "output_text", "text")


class FunctionTool(BaseModel):
    model_config = ConfigDict(extra="allow")  # an mcp tool's fields: mcp_responses.McpTool
    type: str
    name: str | None = Field(None, pattern=r"^[a-zA-Z0-9_.-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")


class TextOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: TextFormat | None = None


class ReasoningOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None


class ResponsesRequest(SamplingFields, Groundable):
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = Field(None, ge=1)
    max_tool_calls: int | None = Field(None, ge=1)  # with mcp tools: the calls run, at most
    text: TextOptions | None = None
    previous_response_id: str | None = None
    reasoning: ReasoningOptions | None = None

    def token_limit(self) -> int | None:
        return self.max_output_tokens

    def thinking(self) -> Thinking:
        return Thinking(effort=self.reasoning.effort if self.reasoning else None)


def conversation(body: ResponsesRequest) -> Conversation:
    if body.previous_response_id:
        raise InvalidRequest("this server keeps no responses (stateless): send the whole "
                             "conversation as input items", param="previous_response_id")
    messages = [Message("system", body.instructions, where="instructions")] \
        if body.instructions else []
    items = [{"role": "user", "content": body.input}] if isinstance(body.input, str) \
        else body.input
    for i, item in enumerate(items):
        messages += _message(item, f"input[{i}]")
    messages = _with_reasoning(messages)
    tools = [tool(t["name"], t.get("description"), t.get("parameters"), where)
             for t, where, _ in _functions(body)]
    return Conversation(tuple(messages), tuple(tools), _choice(body), _schema(body))


# OpenAI's hosted tools: this engine runs none of them (no web search is configured), so
# a request's are left out, and the answer says so, rather than refused: Codex sends
# `web_search` on every request.
HOSTED = ("web_search", "web_search_preview", "file_search", "code_interpreter",
          "image_generation", "computer_use_preview")


def _functions(body: ResponsesRequest) -> list[tuple[dict, str, str | None]]:
    """The request's function tools as (tool, its place, its namespace): a `namespace`
    tool's functions (Codex groups its sub-agent tools so) each under its own name, its
    calls naming the namespace back (`_call_item`). Hosted tools are left out
    (`left_out`); any other kind is a 400 naming it."""
    found = []
    for i, t in enumerate(body.tools or ()):
        where = f"tools[{i}]"
        if t.type == "function" and t.name:
            found.append((t.model_dump(), f"{where}.parameters", None))
        elif t.type == "namespace" and t.name and isinstance(t.model_extra.get("tools"), list):
            for j, inner in enumerate(t.model_extra["tools"]):
                if not isinstance(inner, dict) or inner.get("type") != "function" or \
                        not isinstance(inner.get("name"), str):
                    raise InvalidRequest(f"{where}.tools[{j}]: a namespace holds function "
                                         "tools", param=f"{where}.tools[{j}]")
                found.append((inner, f"{where}.tools[{j}].parameters", t.name))
        elif t.type not in HOSTED:
            raise InvalidRequest(f"{where}: function, namespace and hosted tools are "
                                 f"supported (not {t.type!r})", param=f"{where}.type")
    return found


def left_out(body: ResponsesRequest) -> list[str]:
    """The answer's note on the hosted tools it was offered and does not run."""
    hosted = sorted({t.type for t in body.tools or () if t.type in HOSTED})
    return [f"left out: {', '.join(hosted)} (hosted tools this engine does not run)"] \
        if hosted else []


def _namespaces(body: ResponsesRequest) -> dict[str, str]:
    return {t["name"]: space for t, _, space in _functions(body) if space}


def _message(item: dict, where: str) -> list[Message]:
    kind = item.get("type", "message")
    if kind == "message":
        role = {"developer": "system"}.get(item.get("role"), item.get("role"))
        if role not in ("system", "user", "assistant"):
            raise InvalidRequest(f"{where}.role must be user, assistant, system or developer",
                                 param=f"{where}.role")
        if role != "user":
            return [Message(role, text_of(item.get("content"), f"{where}.content", _TEXT_PARTS),
                            where=where)]
        text, pictures = content_of(item.get("content"), f"{where}.content", _TEXT_PARTS)
        return [Message(role, text, where=where, pictures=pictures)]
    if kind == "function_call":
        try:
            arguments = json.loads(item.get("arguments") or "{}")
        except ValueError:
            raise InvalidRequest(f"{where}.arguments is not JSON",
                                 param=f"{where}.arguments") from None
        return [Message("assistant", calls=(ToolCall(str(item.get("call_id")),
                                                     str(item.get("name")), arguments),),
                        where=where)]
    if kind == "function_call_output":
        output = item.get("output")
        return [Message("tool", output if isinstance(output, str) else json.dumps(output),
                        call_id=item.get("call_id"), where=f"{where}.call_id")]
    if kind == "reasoning":  # an earlier answer's: goes with the assistant turn after it
        parts = item.get("content") or item.get("summary") or []
        text = "".join(p.get("text", "") for p in parts if isinstance(p, dict))
        return [Message("assistant", reasoning=text, where=where)]
    raise InvalidRequest(f"{where}: input items of type {kind!r} are not supported",
                         param=f"{where}.type")


def _with_reasoning(messages: list[Message]) -> list[Message]:
    """Reasoning items join the assistant turn that follows them (its reasoning), their
    texts joined once (added one by one, each copy was quadratic in their number)."""
    out: list[Message] = []
    held: list[Message] = []  # reasoning items waiting for their turn
    for message in messages:
        if message.role == "assistant" and not message.content and not message.calls:
            held.append(message)
            continue
        if held:
            joined = "".join(m.reasoning for m in held)
            if message.role == "assistant":
                message = replace(message, reasoning=joined + message.reasoning)
            else:
                out.append(replace(held[-1], reasoning=joined))
            held = []
        out.append(message)
    if held:
        out.append(replace(held[-1], reasoning="".join(m.reasoning for m in held)))
    return out


def _choice(body: ResponsesRequest) -> Choice:
    value, parallel = body.tool_choice, body.parallel_tool_calls
    if value is None or isinstance(value, str):
        return Choice(value or "auto", parallel=parallel)
    if value.get("type") != "function" or not value.get("name"):
        raise InvalidRequest("a named tool_choice is {\"type\": \"function\", \"name\": ...}",
                             param="tool_choice")
    return Choice("function", value["name"], parallel)


def _schema(body: ResponsesRequest) -> dict | None:
    fmt = body.text.format if body.text else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return {"type": "object"}
    check(fmt.schema_, "text.format.schema")
    return fmt.schema_


class _Output:
    """The response's output items as they are written (stream) or at once."""

    def __init__(self):
        self.text: list[str] = []
        self.reasoning: list[str] = []
        self.calls: list[dict] = []
        self.message_id = f"msg_{uuid.uuid4().hex[:24]}"
        self.reasoning_id = f"rs_{uuid.uuid4().hex[:24]}"

    def items(self) -> list[dict]:
        items = [self.reasoning_item()] if self.reasoning else []
        items += [self.message_item("completed")] if "".join(self.text) or not self.calls \
            else []
        return items + [{**call, "status": "completed"} for call in self.calls]

    def reasoning_item(self, done: bool = True) -> dict:
        text = "".join(self.reasoning) if done else ""
        return {"type": "reasoning", "id": self.reasoning_id, "summary": [],
                "content": [{"type": "reasoning_text", "text": text}] if done else []}

    def message_item(self, status: str) -> dict:
        return {"type": "message", "id": self.message_id, "status": status, "role": "assistant",
                "content": [{"type": "output_text", "text": "".join(self.text),
                             "annotations": []}] if status == "completed" else []}


def _response(body: ResponsesRequest, response_id: str, model: str, output: _Output | None,
              done: Done | None) -> dict:
    status = "in_progress" if done is None else \
        "incomplete" if done.reason == "length" else "completed"
    usage = None if done is None else {
        "input_tokens": done.usage.prompt_tokens, "output_tokens": done.usage.completion_tokens,
        "total_tokens": done.usage.prompt_tokens + done.usage.completion_tokens,
        "input_tokens_details": {"cached_tokens": done.usage.cached_tokens},
        "output_tokens_details": {"reasoning_tokens": 0}}
    return {"id": response_id, "object": "response", "created_at": int(time.time()),
            "status": status, "model": model, "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete"
            else None,
            "instructions": body.instructions, "metadata": {},
            "output": output.items() if output and done else [],
            "parallel_tool_calls": body.parallel_tool_calls,
            "temperature": body.temperature, "top_p": body.top_p,
            "max_output_tokens": body.max_output_tokens,
            "tool_choice": body.tool_choice or "auto",
            "tools": [t.model_dump(exclude_none=True) for t in body.tools or ()],
            "text": {"format": {"type": "text"}}, "usage": usage}


def router(engine: Engine, mcp: bool = True) -> APIRouter:
    """`mcp`: whether a request's mcp tools may reach the owner's servers (not on the
    tokenless Ollama door)."""
    api = APIRouter()

    @api.post("/v1/responses")
    async def responses(body: ResponsesRequest, http: Request):
        if mcp_responses.uses_mcp(body):
            if not mcp:
                raise Forbidden("tools: mcp tools reach the owner's MCP servers, on the "
                                "owner's API (with its token) only", param="tools")
            return await _with_mcp(engine, body, http)
        caller = Caller.of(http)
        turn = await turn_work(engine, caller, conversation_turn, engine, body,
                               partial(conversation, body), caller, thinking=body.thinking())
        turn.notes += left_out(body)
        try:
            started = await turn.start()
        except asyncio.CancelledError:
            return cancelled()
        response_id = f"resp_{uuid.uuid4().hex[:24]}"
        if body.stream:
            return StreamingResponse(_events(turn, body, response_id, started.model),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        try:
            got = await turn.collect()
        except asyncio.CancelledError:
            return cancelled()
        output = _Output()
        output.text.append(got.text)
        output.reasoning = [got.reasoning] if got.reasoning else []
        output.calls = [_call_item(start, args, _namespaces(body)) for start, args in got.calls]
        return {**_response(body, response_id, started.model, output, got.done),
                "homerack": extension(started, turn.notes), **cited(turn)}

    return api


async def _with_mcp(engine: Engine, body: ResponsesRequest, http: Request):
    """A request with `mcp` tools: rounds of generation and calls (mcp_responses.py),
    answered whole, or as a stream of its items once they are done."""
    sources: dict = {}

    async def run_round(round_body: ResponsesRequest):
        caller = Caller.of(http)
        turn = await turn_work(engine, caller, conversation_turn, engine, round_body,
                               partial(conversation, round_body), caller,
                               thinking=round_body.thinking())
        sources.update(cited(turn))  # each round grounded alike: the last one's kept
        return await turn.start(), await turn.collect()

    try:
        items, started, done, usage = await mcp_responses.respond(engine, body, run_round)
    except asyncio.CancelledError:
        return cancelled()
    response = {**_response(body, f"resp_{uuid.uuid4().hex[:24]}", started.model, None, done),
                "output": items, **sources}
    response["usage"].update(input_tokens=usage[0], output_tokens=usage[1],
                             total_tokens=usage[0] + usage[1])
    if body.stream:
        return StreamingResponse(mcp_responses.streamed(response),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return response


def _call_item(start: CallStart, arguments: str, namespaces: dict[str, str]) -> dict:
    item = {"type": "function_call", "id": f"fc_{start.id.removeprefix('call_')}",
            "call_id": start.id, "name": start.name, "arguments": arguments}
    if start.name in namespaces:  # a namespace's function, named as it was offered
        item["namespace"] = namespaces[start.name]
    return item


async def _events(turn: Turn, body: ResponsesRequest, response_id: str,
                  model: str) -> AsyncIterator[str]:
    numbers, namespaces = iter(range(1 << 30)), _namespaces(body)

    def event(kind: str, **data) -> str:
        payload = {"type": kind, "sequence_number": next(numbers), **data}
        return f"event: {kind}\ndata: {json.dumps(payload)}\n\n"

    def close_item() -> list[str]:
        """Ends the item being written (the message, or the last call)."""
        if kind_open == "message":
            text = "".join(output.text)
            part = {"type": "output_text", "text": text, "annotations": []}
            where = {"item_id": output.message_id, "output_index": index, "content_index": 0}
            return [event("response.output_text.done", **where, text=text),
                    event("response.content_part.done", **where, part=part),
                    event("response.output_item.done", output_index=index,
                          item=output.message_item("completed"))]
        if kind_open == "reasoning":
            text = "".join(output.reasoning)
            where = {"item_id": output.reasoning_id, "output_index": index, "content_index": 0}
            return [event("response.reasoning_text.done", **where, text=text),
                    event("response.output_item.done", output_index=index,
                          item=output.reasoning_item())]
        if kind_open == "call":
            call = {**output.calls[-1], "status": "completed"}
            return [event("response.function_call_arguments.done", item_id=call["id"],
                          output_index=index, arguments=call["arguments"]),
                    event("response.output_item.done", output_index=index, item=call)]
        return []

    def failed(error: HomerackError) -> str:
        return event("error", code=error.kind, message=error.message, param=error.param)

    output, index, kind_open = _Output(), -1, None
    shell = {**_response(body, response_id, model, None, None), **cited(turn)}
    yield event("response.created", response=shell)
    yield event("response.in_progress", response=shell)
    async for part in guarded(turn, failed):
        if isinstance(part, str):
            yield part
            return
        if isinstance(part, Reasoning):
            if kind_open != "reasoning":
                for line in close_item():
                    yield line
                index, kind_open = index + 1, "reasoning"
                yield event("response.output_item.added", output_index=index,
                            item=output.reasoning_item(done=False))
            output.reasoning.append(part.text)
            yield event("response.reasoning_text.delta", item_id=output.reasoning_id,
                        output_index=index, content_index=0, delta=part.text)
        elif isinstance(part, Text) and part.text:
            if kind_open != "message":
                for line in close_item():
                    yield line
                index, kind_open = index + 1, "message"
                yield event("response.output_item.added", output_index=index,
                            item=output.message_item("in_progress"))
                yield event("response.content_part.added", item_id=output.message_id,
                            output_index=index, content_index=0,
                            part={"type": "output_text", "text": "", "annotations": []})
            output.text.append(part.text)
            yield event("response.output_text.delta", item_id=output.message_id,
                        output_index=index, content_index=0, delta=part.text)
        elif isinstance(part, CallStart):
            for line in close_item():
                yield line
            index, kind_open = index + 1, "call"
            output.calls.append(_call_item(part, "", namespaces))
            yield event("response.output_item.added", output_index=index,
                        item={**output.calls[-1], "status": "in_progress"})
        elif isinstance(part, CallArgs):
            call = output.calls[-1]
            call["arguments"] += part.text
            yield event("response.function_call_arguments.delta", item_id=call["id"],
                        output_index=index, delta=part.text)
        elif isinstance(part, Done):
            for line in close_item():
                yield line
            final = {**_response(body, response_id, model, output, part), **cited(turn)}
            yield event("response.completed" if final["status"] == "completed"
                        else "response.incomplete", response=final)
