"""The engine's HTTP API, put together: the routes of each wire format (openai_routes.py,
anthropic_routes.py, responses_routes.py, embeddings_routes.py, ollama_routes.py), the
engine's own
(admin_routes.py) and the Hub's (hub_routes.py, given by `serve`).

Every route needs the token, as `Authorization: Bearer` or `x-api-key` (what Anthropic's
clients send), except /health, which without it says only that the engine is alive.
Errors answer in OpenAI's shape ({"error": {"message", "type", "param", "code"}}), or
Anthropic's or Ollama's on their routes, mapped here in one place. Every request first passes
guard.RequestGuard (its Host, its body's size); the OpenAPI schema and /docs are served
only when asked for (`serve --api-docs`).
"""

from __future__ import annotations

import logging
import secrets
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ..engine import Engine
from ..errors import HomerackError, QueueFull, Unauthorized
from . import (admin_routes, anthropic_routes, embeddings_routes, ollama_routes, openai_routes,
               responses_routes, tool_routes, document_routes)
from .front_door import FrontDoor
from .guard import GENERATION_ONLY, BodyTooLarge, RequestGuard
from .wire import openai_error


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('msg')}", None
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    return f"{param or 'body'}: {first.get('msg')}", param


def _body_for(path: str, status: int, message: str, kind: str, param: str | None) -> dict:
    if anthropic_routes.is_anthropic(path):
        return anthropic_routes.anthropic_error(status, message, param)
    if ollama_routes.is_ollama(path):
        return ollama_routes.ollama_error(message)
    return openai_error(message, kind, param)


def _error_response(request: Request, status: int, message: str, kind: str,
                    param: str | None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(_body_for(request.url.path, status, message, kind, param), status,
                        headers=headers)


def create_app(engine: Engine, token: str, on_startup=None, routers: tuple = (),
               api_docs: bool = False, host_names: frozenset[str] = frozenset(),
               generation_only: bool = False) -> FastAPI:
    """`host_names`: names besides loopback's and IP literals that requests may address
    the engine by (serve --host NAME). `generation_only`: the routes of
    guard.GENERATION_ONLY and no other (serve --generation-only)."""
    @asynccontextmanager
    async def lifespan(_app):
        if on_startup is not None:
            on_startup()
        yield

    docs = {} if api_docs else {"openapi_url": None, "docs_url": None, "redoc_url": None}
    app = FastAPI(title="Homerack engine", version="0.1.0", lifespan=lifespan, **docs)
    expected = token.encode()

    def token_given(request: Request) -> bool:
        return token_in(request.headers)

    def token_in(headers) -> bool:
        bearer = headers.get("authorization", "")
        given = bearer[7:] if bearer.startswith("Bearer ") else headers.get("x-api-key", "")
        return secrets.compare_digest(given.encode(), expected)

    if engine.replicas is not None:  # inside the guard: bodies capped, Host checked first
        app.add_middleware(FrontDoor, engine=engine, replicas=engine.replicas,
                           token_given=token_in)
    app.add_middleware(RequestGuard, names=host_names, error_for=lambda path, status, message:
                       _body_for(path, status, message, "invalid_request_error", None),
                       routes=GENERATION_ONLY if generation_only else None)

    def require_token(request: Request) -> None:
        if not token_given(request):
            raise Unauthorized("missing or wrong API token (Authorization: Bearer <token>, "
                               "or x-api-key: <token>)")

    _answer_errors(app)

    guarded = [Depends(require_token)]
    for router in (*routers, openai_routes.router(engine), anthropic_routes.router(engine),
                   responses_routes.router(engine), embeddings_routes.router(engine),
                   ollama_routes.router(engine), admin_routes.router(engine),
                   tool_routes.router(engine), document_routes.router(engine)):
        app.include_router(router, dependencies=guarded)

    @app.get("/health")
    async def health(request: Request):
        """Alive, to anyone; the engine's status (models, paths, errors) with the token."""
        return {"status": "ok", **engine.status()} if token_given(request) else {"status": "ok"}

    return app


def _answer_errors(app: FastAPI) -> None:
    """Every error answered in its route's API's shape, with its status."""
    @app.exception_handler(HomerackError)
    async def _homerack_error(request: Request, exc: HomerackError):
        headers = {"Retry-After": str(exc.retry_after_s)} if isinstance(exc, QueueFull) else None
        return _error_response(request, exc.status, exc.message, exc.kind, exc.param, headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        """A bug, answered in the route's error shape (the engine goes on serving)."""
        logging.getLogger("homerack").exception("%s %s failed", request.method, request.url.path)
        return _error_response(request, 500, f"internal error: {type(exc).__name__}: {exc}",
                               "server_error", None)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge):
        return _error_response(request, 413, exc.detail, "invalid_request_error", None)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return _error_response(request, 400, message, "invalid_request_error", param)


def create_ollama_app(engine: Engine) -> FastAPI:
    """Ollama's routes alone and without the token, for apps that cannot send one
    (`serve --ollama-port`, off by default): served on loopback only, the Host header
    checked (a web page cannot reach it through DNS rebinding), bodies capped."""
    app = FastAPI(title="Homerack engine (Ollama's API)", openapi_url=None, docs_url=None,
                  redoc_url=None)
    app.add_middleware(RequestGuard, names=frozenset(), error_for=lambda path, status, message:
                       ollama_routes.ollama_error(message))
    _answer_errors(app)
    app.include_router(ollama_routes.router(engine))
    return app

