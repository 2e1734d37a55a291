"""The engine's HTTP API, put together: the routes of each wire format (wire_formats/), the
owner's (admin/; the Hub's, admin/hub_routes.py, given by `serve`); the Ollama app; the
app the home's devices reach through the sharing listener. The one module of the server
that mounts routes: the rest of server/ knows no wire format (a contract).

Every route needs the token, as `Authorization: Bearer` or `x-api-key` (what Anthropic's
clients send), except /health, which without it says only that the engine is alive.
Errors answer in OpenAI's shape ({"error": {"message", "type", "param", "code"}}), or
Anthropic's or Ollama's on their routes, mapped here in one place. Every request first passes
guard.RequestGuard (its Host, its body's size); the OpenAPI schema and /docs are served
only when asked for (`serve --api-docs`).
"""

from __future__ import annotations

import secrets
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request

from ...engine import Engine
from ...errors import Unauthorized
from ..admin import admin_routes, document_routes, home_admin_routes, tool_routes
from ..home import home_routes
from ..wire import error_body, ollama_error
from ..wire_formats import (anthropic_routes, audio_routes, embeddings_routes, ollama_routes,
                           openai_routes, responses_routes)
from .error_replies import answer_errors
from .front_door import FrontDoor
from .guard import GENERATION_ONLY, RequestGuard
from .home_door import MDNS_NAME, DeviceGate, HomeDoor
from .origins import DoorOrigins


def create_app(engine: Engine, token: str, on_startup=None, routers: tuple = (),
               api_docs: bool = False, host_names: frozenset[str] = frozenset(),
               generation_only: bool = False) -> FastAPI:
    """`host_names`: names besides loopback's and IP literals that requests may address
    the engine by (serve --host NAME). `generation_only`: the routes of
    guard.GENERATION_ONLY and no other (serve --generation-only)."""
    # the sharing listener, opened by serve or the owner
    door = HomeDoor(engine, share_app=lambda: create_share_app(engine))

    @asynccontextmanager
    async def lifespan(_app):
        if on_startup is not None:
            on_startup()
        yield
        await door.close()

    docs = {} if api_docs else {"openapi_url": None, "docs_url": None, "redoc_url": None}
    app = FastAPI(title="Homerack engine", version="0.1.0", lifespan=lifespan, **docs)
    app.state.door = door
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
    app.add_middleware(RequestGuard, names=host_names,
                       error_for=lambda path, status, message, param=None:
                       error_body(path, status, message, "invalid_request_error", param),
                       routes=GENERATION_ONLY if generation_only else None)

    def require_token(request: Request) -> None:
        if not token_given(request):
            raise Unauthorized("missing or wrong API token (Authorization: Bearer <token>, "
                               "or x-api-key: <token>)")

    answer_errors(app)

    guarded = [Depends(require_token)]
    for router in (*routers, openai_routes.router(engine), anthropic_routes.router(engine),
                   responses_routes.router(engine), embeddings_routes.router(engine),
                   ollama_routes.router(engine), admin_routes.router(engine),
                   tool_routes.router(engine), document_routes.router(engine),
                   home_admin_routes.router(engine, door), audio_routes.router(engine)):
        app.include_router(router, dependencies=guarded)

    @app.get("/health")
    async def health(request: Request):
        """Alive, to anyone; the engine's status (models, paths, errors) with the token."""
        return {"status": "ok", **engine.status()} if token_given(request) else {"status": "ok"}

    return app


def create_ollama_app(engine: Engine) -> FastAPI:
    """Ollama's routes without the token, for apps that cannot send one (`serve
    --ollama-port`, off by default), with the OpenAI-compatible `/v1` Ollama serves
    beside them: served on loopback only, the Host header checked (a web page cannot
    reach it through DNS rebinding), a page's Origin checked as Ollama does (origins.py),
    bodies capped. Its requests are a client of their own (events.LOCAL_DOOR): none of the
    owner's cached prompts or answers, no documents, no MCP tools."""
    app = FastAPI(title="Homerack engine (Ollama's API)", openapi_url=None, docs_url=None,
                  redoc_url=None)
    app.add_middleware(DoorOrigins)  # inside the guard: Host and body checked first
    app.add_middleware(RequestGuard, names=frozenset(),
                       error_for=lambda path, status, message, param=None: ollama_error(message))
    answer_errors(app)
    # and OpenAI's API, as Ollama serves it on its own port (Codex, opencode and other
    # tools probe /v1 there); MCP tools, which reach the owner's servers, are refused
    for router in (ollama_routes.router(engine), ollama_routes.openai_door(engine),
                   openai_routes.router(engine), responses_routes.router(engine, mcp=False),
                   embeddings_routes.router(engine)):
        app.include_router(router)
    return app


def create_share_app(engine: Engine) -> FastAPI:
    """What the home's paired devices reach on the sharing listener (home_door.py): the
    gate, the guard, errors naming nothing of the owner's, generation in every wire
    format, the pairing page, the web chat and their conversations."""
    app = FastAPI(title="Homerack (this home's devices)", openapi_url=None, docs_url=None,
                  redoc_url=None)
    app.add_middleware(DeviceGate, engine=engine)
    app.add_middleware(RequestGuard, names=frozenset({MDNS_NAME}),
                       error_for=lambda path, status, message, param=None:
                       error_body(path, status, message, "invalid_request_error", param))
    answer_errors(app, devices=True)
    for router in (home_routes.router(engine), openai_routes.router(engine),
                   anthropic_routes.router(engine), embeddings_routes.router(engine),
                   ollama_routes.router(engine), audio_routes.router(engine)):
        app.include_router(router)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    return app
