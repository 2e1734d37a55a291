"""What every request passes before FastAPI reads it: the Host it names, the size of
its body, its text (text_check.py: no lone surrogate in a JSON string), and (an engine
serving generation only) its route.

FastAPI parses a body before a route's dependencies (the token check) run, so without a
cap here an unauthenticated client could make the engine buffer without bound. And a
web page the user opens can reach 127.0.0.1 through DNS rebinding (its own name,
re-pointed at loopback); such a request carries that name in `Host`, so only loopback
names, IP literals and the names the engine was told to serve under are let in.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Callable

from starlette.exceptions import HTTPException

from .text_check import lone_surrogate, refusal

MAX_BODY_BYTES = 16 * 1024 * 1024  # a 128k-token conversation is ~1 MB of JSON
AUDIO_BODY_BYTES = 26 * 1024 * 1024  # a 25 MiB recording, as OpenAI's API takes, and its form
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
# What an engine serving only generation answers (a worker's replica engine, which paired
# hosts reach with its token): no loading, presets or downloads with the owner's HF_TOKEN.
GENERATION_ONLY = frozenset({("GET", "/health"), ("GET", "/v1/models")} | {
    ("POST", path) for path in ("/v1/chat/completions", "/v1/completions", "/v1/messages",
                                "/v1/messages/count_tokens", "/v1/responses", "/v1/embeddings")})


def host_name(host_header: str) -> str:
    """The name part of a Host header: without its port, brackets and letter case."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_allowed(host_header: str, names: frozenset[str] = frozenset()) -> bool:
    name = host_name(host_header)
    if name in LOOPBACK_NAMES or name.endswith(".localhost") or name in names:
        return True
    try:
        ipaddress.ip_address(name)  # an address literal is no rebinding vector
        return True
    except ValueError:
        return False


def asgi_headers(scope) -> dict[str, str]:
    """An ASGI request's headers by lower-case name (the last of a repeated one)."""
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", ())}


class RequestGuard:
    """ASGI middleware: 421 for a Host that is not ours, 413 for a body over the cap
    (announced: refused here; counted as it arrives: BodyTooLarge), 400 for a body whose
    text is no Unicode, 404 for a route outside `routes` when given. `error_for(path,
    status, message, param)` gives the body in the route's error shape."""

    def __init__(self, app, error_for: Callable[..., dict],
                 names: frozenset[str] = frozenset(), max_body: int = MAX_BODY_BYTES,
                 routes: frozenset[tuple[str, str]] | None = None):
        self.app, self.error_for, self.names, self.max_body = app, error_for, names, max_body
        self.routes = routes

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = asgi_headers(scope)
        if not host_allowed(headers.get("host", ""), self.names):
            return await self._refuse(scope, send, 421, "this engine answers only requests "
                                      "addressed to localhost or an IP address (Host header)")
        if self.routes is not None and (scope["method"], scope["path"]) not in self.routes:
            return await self._refuse(scope, send, 404, "this engine serves generation, "
                                      "the model list and /health only")
        max_body = max(self.max_body, AUDIO_BODY_BYTES) \
            if scope["path"].startswith("/v1/audio/") else self.max_body
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > max_body:
            return await self._refuse(scope, send, 413, self._too_large(max_body))
        if scope["method"] in ("POST", "PUT", "PATCH") and \
                not headers.get("content-type", "").startswith("multipart/"):
            return await self._checked(scope, receive, send, max_body)
        seen = 0

        async def counting_receive():
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > max_body:  # a body sent without Content-Length (chunked)
                raise BodyTooLarge(413, self._too_large(max_body))
            return message

        await self.app(scope, counting_receive, send)

    async def _checked(self, scope, receive, send, max_body: int) -> None:
        """A body read whole (FastAPI reads it whole too), its text checked, then handed
        on; what the app receives after it (a disconnect) comes from the client."""
        parts, seen, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending
                return
            parts.append(message.get("body", b""))
            seen += len(parts[-1])
            if seen > max_body:  # a body sent without Content-Length (chunked)
                return await self._refuse(scope, send, 413, self._too_large(max_body))
            more = message.get("more_body", False)
        body = b"".join(parts)
        field = lone_surrogate(body)
        if field is not None:
            return await self._refuse(scope, send, 400, refusal(field), param=field)
        await self.app(scope, replayed(body, receive), send)

    @staticmethod
    def _too_large(max_body: int) -> str:
        return f"the request body is over {max_body // (1024 * 1024)} MiB"

    async def _refuse(self, scope, send, status: int, message: str,
                      param: str | None = None) -> None:
        body = json.dumps(self.error_for(scope.get("path", ""), status, message, param),
                          ensure_ascii=True).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


def replayed(body: bytes, receive):
    """An ASGI receive giving the body read already, then the client's own messages (its
    disconnect ends a stream)."""
    sent = False

    async def replay():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replay


class BodyTooLarge(HTTPException):
    """Raised from the app's receive when a streamed body passes the cap: an
    HTTPException, so that FastAPI's body reading lets it through to the handler the
    app registers for it (any other error there becomes a generic 400)."""
