"""What the route modules and the server share on the wire (so that none imports
another): the error shapes (OpenAI's, Anthropic's, Ollama's) and which a path answers
in, one server-sent event, the answer for a client that left, and the `homerack`
extension object each answer carries."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Awaitable, Callable

from fastapi.responses import JSONResponse

from ..events import LOCAL_DOOR, Started


def device_of(http) -> str | None:
    """The paired device a request comes from (set by the sharing listener's gate,
    home_door.py); None for the owner's."""
    return getattr(http.state, "device", None)


async def _never_gone() -> bool:
    return False


def through_door(http) -> bool:
    """The request came through the tokenless Ollama door (set by its app, factory.py)."""
    return getattr(http.state, "door", False)


@dataclass(frozen=True)
class Caller:
    """Who asks for a turn, as the turn needs it: the device (None: the owner or a
    program through the Ollama door, `door`), the HTTP Cache-Control it sent, and whether
    it has gone (a turn it leaves stops). Read from the HTTP request once (`of`); the web
    chat's replies outlive the page, so theirs never goes."""
    device: str | None = None
    cache_control: str = ""
    gone: Callable[[], Awaitable[bool]] = _never_gone
    door: bool = False

    @property
    def client(self) -> str | None:
        """Whose caches the turn uses (GenerationRequest.client): the device's, the
        door's, or (None) the owner's."""
        return LOCAL_DOOR if self.door and self.device is None else self.device

    @classmethod
    def of(cls, http) -> "Caller":
        return cls(device_of(http), http.headers.get("cache-control", ""),
                   http.is_disconnected, through_door(http))


def extension(started: Started, notes: list[str] = ()) -> dict:
    return {"chat_format": started.chat_format, "notes": [*started.notes, *notes],
            "n_ctx": started.n_ctx, "response_cache": started.response_cache,
            "route": started.route, "adapters": list(started.adapters)}


def cited(turn) -> dict:
    """A grounded turn's `citations` for its answer (nothing when none were asked)."""
    return {"citations": turn.citations} if turn.citations is not None else {}


def openai_error(message: str, kind: str, param: str | None = None) -> dict:
    """OpenAI's error shape (every route but Anthropic's and Ollama's answers in it)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": kind}}


_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 503: "overloaded_error"}


def is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def anthropic_error(status: int, message: str, param: str | None = None) -> dict:
    error = {"type": _ANTHROPIC_TYPES.get(status, "api_error"), "message": message}
    if param:
        error["param"] = param
    return {"type": "error", "error": error}


def is_ollama(path: str) -> bool:
    return path.startswith("/api/")


def ollama_error(message: str) -> dict:
    return {"error": message}


def error_body(path: str, status: int, message: str, kind: str, param: str | None) -> dict:
    """An error in the shape of the API `path` belongs to."""
    if is_anthropic(path):
        return anthropic_error(status, message, param)
    if is_ollama(path):
        return ollama_error(message)
    return openai_error(message, kind, param)


def cancelled() -> JSONResponse:
    return JSONResponse(openai_error("client disconnected", "cancelled"), 499)


def sse(payload: dict) -> str:
    """One server-sent event carrying `payload` as JSON."""
    return f"data: {json.dumps(payload)}\n\n"
