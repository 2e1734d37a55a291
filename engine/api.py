"""The engine's HTTP API: OpenAI-compatible routes over the generation loop.

Every route but /health needs the bearer token. Errors answer in OpenAI's shape
({"error": {"message", "type", "param", "code"}}), mapped here in one place.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
import uuid
import weakref
from contextlib import asynccontextmanager
from typing import AsyncIterator

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from .errors import HomerackError, InvalidRequest, ModelNotFound, QueueFull, Unauthorized
from .engine import Engine
from .events import Delta, Failed, Finished, GenerationRequest, Job, Started, Usage
from .metrics import prometheus_text
from .model_host import LoadOverride
from .schemas import ChatCompletionRequest, CompletionRequest, LoadRequest

FINGERPRINT = "homerack-0.1"


def error_body(message: str, kind: str, param: str | None = None) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": kind}}


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('msg')}", None
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    return f"{param or 'body'}: {first.get('msg')}", param


def _usage_json(usage: Usage) -> dict:
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
    }


def _extension(started: Started) -> dict:
    return {"chat_format": started.chat_format, "notes": list(started.notes),
            "n_ctx": started.n_ctx}


class _Dispatcher:
    """Hands events from the engine thread to one event loop. A step emits a token for
    every stream at once: one wake-up of the loop per burst, not one per event (each
    is a write to the loop's self-pipe, on the thread that feeds llama.cpp)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._pending: list[tuple[asyncio.Queue, object]] = []
        self._lock = threading.Lock()

    def post(self, queue: asyncio.Queue, event) -> None:
        with self._lock:
            self._pending.append((queue, event))
            if len(self._pending) > 1:  # a wake-up is already on its way
                return
        self._loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
        for queue, event in pending:
            queue.put_nowait(event)


_dispatchers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> dispatcher


class _Channel:
    """Carries events from the engine thread into this request's event loop."""

    def __init__(self):
        loop = asyncio.get_running_loop()
        self._dispatcher = _dispatchers.setdefault(loop, _Dispatcher(loop))
        self._queue: asyncio.Queue = asyncio.Queue()

    def emit(self, event) -> None:
        self._dispatcher.post(self._queue, event)

    async def next(self, job: Job, http: Request):
        """The next event; cancels the job if the client goes away while waiting."""
        while True:
            try:
                return await asyncio.wait_for(self._queue.get(), timeout=0.25)
            except asyncio.TimeoutError:
                if await http.is_disconnected():
                    job.cancel()
                    raise asyncio.CancelledError("client disconnected")


class _Kind:
    """What differs between chat and text completions: object names and choice shape."""

    def __init__(self, chat: bool):
        self.chat = chat
        self.prefix = "chatcmpl" if chat else "cmpl"
        self.object = "chat.completion" if chat else "text_completion"
        self.chunk_object = "chat.completion.chunk" if chat else "text_completion"

    def choice(self, text: str, reason: str | None) -> dict:
        if self.chat:
            return {"index": 0, "message": {"role": "assistant", "content": text},
                    "logprobs": None, "finish_reason": reason}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}

    def chunk_choice(self, text: str | None, reason: str | None, first: bool = False) -> dict:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else {}
            if text is not None:
                delta["content"] = text
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return {"index": 0, "text": text or "", "logprobs": None, "finish_reason": reason}


def create_app(engine: Engine, token: str, on_startup=None, routers: tuple = ()) -> FastAPI:
    @asynccontextmanager
    async def lifespan(_app):
        if on_startup is not None:
            on_startup()
        yield

    app = FastAPI(title="Homerack engine", version="0.1.0", lifespan=lifespan)
    expected = f"Bearer {token}".encode()

    def require_token(request: Request) -> None:
        given = request.headers.get("authorization", "").encode()
        if not secrets.compare_digest(given, expected):
            raise Unauthorized("missing or wrong API token (Authorization: Bearer <token>)")

    @app.exception_handler(HomerackError)
    async def _homerack_error(_: Request, exc: HomerackError):
        headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, QueueFull) else None
        return JSONResponse(error_body(exc.message, exc.kind, exc.param), exc.status,
                            headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(_: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return JSONResponse(error_body(message, "invalid_request_error", param), 400)

    for router in routers:
        app.include_router(router, dependencies=[Depends(require_token)])

    @app.get("/health")
    async def health():
        return {"status": "ok", **engine.status()}

    @app.get("/metrics", dependencies=[Depends(require_token)])
    async def metrics():
        """The engine's figures in Prometheus' text format (as llama.cpp's server has)."""
        body, content_type = prometheus_text(engine.status())
        return Response(body, media_type=content_type)

    @app.get("/v1/cluster", dependencies=[Depends(require_token)])
    async def cluster():
        """The machines, their stages, links and figures (the app's dashboard)."""
        return engine.cluster_status() or {"workers": []}

    @app.get("/v1/hardware", dependencies=[Depends(require_token)])
    async def hardware():
        from .probe import probe

        return probe().as_dict()

    @app.get("/v1/models", dependencies=[Depends(require_token)])
    async def list_models():
        loaded = engine.status()["model"]
        return {"object": "list", "data": [
            {"id": m.id, "object": "model", "created": int(m.path.stat().st_mtime),
             "owned_by": "local", **m.as_dict(), "loaded": m.id == loaded}
            for m in engine.store.list()]}

    def _override(body: LoadRequest) -> LoadOverride | None:
        if body.n_ctx is None and body.gpu_layers is None:
            return None
        return LoadOverride(body.n_ctx, body.gpu_layers)

    @app.post("/v1/plan", dependencies=[Depends(require_token)])
    async def preview_plan(body: LoadRequest):
        """What loading the model with these choices would use on this machine."""
        model = engine.store.resolve(body.model)
        planned = await asyncio.to_thread(engine.plan_for, model, _override(body))
        if planned is None:
            raise InvalidRequest(f"{model.id}: the planner cannot read this model's shape",
                                 param="model")
        return planned.as_dict()

    @app.post("/v1/models/load", dependencies=[Depends(require_token)])
    async def load_model(body: LoadRequest, http: Request):
        """Load (or reload) the model with these choices; answers when it is loaded."""
        model = engine.store.resolve(body.model)
        channel = _Channel()
        job = engine.load(model, _override(body), channel.emit)
        event = await channel.next(job, http)
        if isinstance(event, Failed):
            raise event.error
        return engine.status()

    def _generation_request(body, **content) -> GenerationRequest:
        default = engine.default_model()
        model = engine.store.resolve(body.model) if body.model or not default else default
        draft, speculation = None, body.speculation
        if body.draft_model:
            speculation = speculation or "draft"
            if body.draft_model != "auto":
                try:
                    draft = engine.store.resolve(body.draft_model)
                except ModelNotFound as exc:
                    raise ModelNotFound(exc.message, param="draft_model") from None
        return GenerationRequest(model=model, max_tokens=body.token_limit(),
                                 sampling=body.sampling(), stop=body.stop_strings(),
                                 ignore_eos=body.ignore_eos, speculation=speculation,
                                 draft_model=draft, cache_prompt=body.cache_prompt, **content)

    @app.post("/v1/chat/completions", dependencies=[Depends(require_token)])
    async def chat_completions(body: ChatCompletionRequest, http: Request):
        messages = tuple(m.as_template_input() for m in body.messages)
        return await _respond(_Kind(chat=True), _generation_request(body, messages=messages),
                              body, http)

    @app.post("/v1/completions", dependencies=[Depends(require_token)])
    async def completions(body: CompletionRequest, http: Request):
        return await _respond(_Kind(chat=False), _generation_request(body, prompt=body.prompt),
                              body, http)

    async def _respond(kind: _Kind, request: GenerationRequest, body, http: Request):
        channel = _Channel()
        job = engine.submit(request, channel.emit)
        try:
            first = await channel.next(job, http)
        except asyncio.CancelledError:
            return JSONResponse(error_body("client disconnected", "cancelled"), 499)
        if isinstance(first, Failed):
            raise first.error
        meta = {"id": f"{kind.prefix}-{uuid.uuid4().hex[:24]}", "created": int(time.time()),
                "model": first.model, "system_fingerprint": FINGERPRINT}
        if body.stream:
            stream = _stream(kind, job, channel, http, first, meta, body.include_usage())
            return StreamingResponse(stream, media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await _collect(kind, job, channel, http, first, meta)

    async def _collect(kind, job, channel, http, started: Started, meta: dict):
        parts = []
        while True:
            try:
                event = await channel.next(job, http)
            except asyncio.CancelledError:
                return JSONResponse(error_body("client disconnected", "cancelled"), 499)
            if isinstance(event, Delta):
                parts.append(event.text)
            elif isinstance(event, Failed):
                raise event.error
            elif isinstance(event, Finished):
                return {**meta, "object": kind.object,
                        "choices": [kind.choice("".join(parts), event.finish_reason)],
                        "usage": _usage_json(event.usage), "homerack": _extension(started)}

    async def _stream(kind, job, channel, http, started: Started, meta: dict,
                      include_usage: bool) -> AsyncIterator[str]:
        def chunk(choices: list, usage=None, extra: dict | None = None) -> str:
            payload = {**meta, "object": kind.chunk_object, "choices": choices}
            if include_usage:
                payload["usage"] = usage
            if extra:
                payload.update(extra)
            return f"data: {json.dumps(payload)}\n\n"

        try:
            if kind.chat:
                yield chunk([kind.chunk_choice(None, None, first=True)],
                            extra={"homerack": _extension(started)})
            while True:
                event = await channel.next(job, http)
                if isinstance(event, Delta):
                    yield chunk([kind.chunk_choice(event.text, None)])
                elif isinstance(event, Failed):
                    error = event.error
                    yield f"data: {json.dumps(error_body(error.message, error.kind, error.param))}\n\n"
                    return
                elif isinstance(event, Finished):
                    yield chunk([kind.chunk_choice(None, event.finish_reason)])
                    if include_usage:
                        yield chunk([], usage=_usage_json(event.usage))
                    yield "data: [DONE]\n\n"
                    return
        finally:
            job.cancel()  # a no-op when finished; stops generation when the client left

    return app
