"""OpenAI's /v1/chat/completions (with tools and response_format) and /v1/completions."""

from __future__ import annotations

import asyncio
from functools import partial
import time
import uuid
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from ...formats.parsed import CallArgs, CallStart, Reasoning, Text
from ...engine import Engine
from ...events import Started, Usage
from ..schemas import ChatCompletionRequest, CompletionRequest, chat_conversation
from ..turns import Done, Turn, completion_turn, conversation_turn, guarded
from ..side_work import turn_work
from ..wire import Caller, cancelled, cited, extension, openai_error, sse

FINGERPRINT = "homerack-0.1"


def usage_json(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "timings": {
            "queue_s": usage.queue_s,
            "time_to_first_token_s": usage.time_to_first_token_s,
            "prompt_tokens_per_s": usage.prompt_tokens_per_s,
            "decode_tokens_per_s": usage.decode_tokens_per_s,
            "inter_token_p50_s": usage.inter_token_p50_s,
            "inter_token_p95_s": usage.inter_token_p95_s,
            "shared_streams": usage.shared_streams,
        },
        **({"speculative": usage.speculative} if usage.speculative else {}),
        **({"response_cache": "hit"} if usage.from_response_cache else {}),
        **({"confidence": usage.confidence} if usage.confidence is not None else {}),
        **({"images": {"chunks": usage.images, "encode_s": usage.image_encode_s}}
           if usage.images else {}),
    }


def error_event(error) -> str:
    return sse(openai_error(error.message, error.kind, error.param))


def router(engine: Engine) -> APIRouter:
    api = APIRouter()

    @api.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, http: Request):
        caller = Caller.of(http)
        turn = await turn_work(engine, caller, conversation_turn, engine, body,
                               partial(chat_conversation, body), caller, thinking=body.thinking())
        try:
            started = await turn.start()
        except asyncio.CancelledError:
            return cancelled()
        meta = _meta("chatcmpl", started)
        sources = cited(turn)
        if body.stream:  # the sources in the first chunk
            return _streaming(_chat_chunks(turn, meta, body.include_usage(), sources))
        try:
            got = await turn.collect()
        except asyncio.CancelledError:
            return cancelled()
        calls = [{"id": start.id, "type": "function",
                  "function": {"name": start.name, "arguments": args or "{}"}}
                 for start, args in got.calls]
        message = {"role": "assistant", "content": got.text if got.text or not calls else None,
                   **({"reasoning_content": got.reasoning} if got.reasoning else {}),
                   **({"tool_calls": calls} if calls else {})}
        return {**meta, "object": "chat.completion",
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": got.done.reason}],
                "usage": usage_json(got.done.usage), "homerack": extension(started, turn.notes),
                **sources}

    @api.post("/v1/completions")
    async def completions(body: CompletionRequest, http: Request):
        turn = completion_turn(engine, body, body.prompt, Caller.of(http))
        try:
            started = await turn.start()
        except asyncio.CancelledError:
            return cancelled()
        meta = _meta("cmpl", started)
        if body.stream:
            return _streaming(_text_chunks(turn, meta, body.include_usage()))
        try:
            got = await turn.collect()
        except asyncio.CancelledError:
            return cancelled()
        return {**meta, "object": "text_completion",
                "choices": [{"index": 0, "text": got.text, "logprobs": None,
                             "finish_reason": got.done.reason}],
                "usage": usage_json(got.done.usage), "homerack": extension(started)}

    return api


def _meta(prefix: str, started: Started) -> dict:
    return {"id": f"{prefix}-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
            "model": started.model, "system_fingerprint": FINGERPRINT}


def _streaming(chunks: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(chunks, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})


async def _chat_chunks(turn: Turn, meta: dict, include_usage: bool,
                       first: dict | None = None) -> AsyncIterator[str]:
    def chunk(delta: dict | None, reason=None, usage=None, extra=None) -> str:
        choices = [] if delta is None else [{"index": 0, "delta": delta, "logprobs": None,
                                             "finish_reason": reason}]
        payload = {**meta, "object": "chat.completion.chunk", "choices": choices}
        if include_usage:
            payload["usage"] = usage
        return sse({**payload, **(extra or {})})

    yield chunk({"role": "assistant", "content": ""},
                extra={"homerack": extension(turn.started, turn.notes), **(first or {})})
    async for part in guarded(turn, error_event):
        if isinstance(part, str):  # a failure midway: the choice ends, then the error
            yield chunk({}, "error")
            yield part
        elif isinstance(part, Text):
            yield chunk({"content": part.text})
        elif isinstance(part, Reasoning):
            yield chunk({"reasoning_content": part.text})
        elif isinstance(part, CallStart):
            yield chunk({"tool_calls": [{"index": part.index, "id": part.id, "type": "function",
                                         "function": {"name": part.name, "arguments": ""}}]})
        elif isinstance(part, CallArgs):
            yield chunk({"tool_calls": [{"index": part.index,
                                         "function": {"arguments": part.text}}]})
        elif isinstance(part, Done):
            yield chunk({}, part.reason)
            if include_usage:
                yield chunk(None, usage=usage_json(part.usage))
            yield "data: [DONE]\n\n"


async def _text_chunks(turn: Turn, meta: dict, include_usage: bool) -> AsyncIterator[str]:
    def chunk(text: str | None, reason=None, usage=None) -> str:
        choices = [] if text is None else [{"index": 0, "text": text, "logprobs": None,
                                            "finish_reason": reason}]
        payload = {**meta, "object": "text_completion", "choices": choices}
        if include_usage:
            payload["usage"] = usage
        return sse(payload)

    async for part in guarded(turn, error_event):
        if isinstance(part, str):  # a failure midway: the choice ends, then the error
            yield chunk("", "error")
            yield part
        elif isinstance(part, Text):
            yield chunk(part.text)
        elif isinstance(part, Done):
            yield chunk("", part.reason)
            if include_usage:
                yield chunk(None, usage=usage_json(part.usage))
            yield "data: [DONE]\n\n"
