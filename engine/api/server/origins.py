"""The web pages the tokenless Ollama door answers, as Ollama decides it: a request that
names an `Origin` (a browser sends one with every cross-site request a page makes) is
answered only when that origin is this computer's (localhost, 127.0.0.1, 0.0.0.0 on any
port), an app's own (app://, file://, tauri://, vscode-webview://, vscode-file://) or
listed in `OLLAMA_ORIGINS` (comma-separated, `*` wildcards, as Ollama reads it); a
request without one (a program, not a page) passes. Without it, any page the user opened
could chat with the models or unload them through the door, the moment a body's
Content-Type stopped keeping it out.
"""

from __future__ import annotations

import fnmatch
import json
import os

from .guard import asgi_headers

_LOCAL = ("localhost", "127.0.0.1", "0.0.0.0", "[::1]")
_APPS = ("app://*", "file://*", "tauri://*", "vscode-webview://*", "vscode-file://*")


def allowed_origins(env=os.environ) -> tuple[str, ...]:
    given = [o.strip() for o in env.get("OLLAMA_ORIGINS", "").split(",") if o.strip()]
    local = [f"{scheme}://{host}{port}" for host in _LOCAL for scheme in ("http", "https")
             for port in ("", ":*")]
    return (*given, *local, *_APPS)


def origin_allowed(origin: str, patterns: tuple[str, ...]) -> bool:
    origin = origin.strip().lower()
    return any(fnmatch.fnmatchcase(origin, p.lower()) for p in patterns)


class DoorOrigins:
    """ASGI middleware of the Ollama door: 403 for a page of another origin; the
    request marked as the door's (`request.state.door`: its own caches, wire.Caller)."""

    def __init__(self, app, patterns: tuple[str, ...] | None = None):
        self.app = app
        self.patterns = patterns if patterns is not None else allowed_origins()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        origin = asgi_headers(scope).get("origin")
        if origin is not None and not origin_allowed(origin, self.patterns):
            body = json.dumps({"error": f"origin {origin!r} is not allowed: Ollama's API "
                               "without the token answers this computer's pages and apps "
                               "(OLLAMA_ORIGINS adds others)"}).encode()
            await send({"type": "http.response.start", "status": 403,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            return await send({"type": "http.response.body", "body": body})
        scope.setdefault("state", {})["door"] = True
        await self.app(scope, receive, send)
