"""What the route modules share on the wire (so that none imports another): OpenAI's
error shape, which every route but Anthropic's answers in, the answer for a client that
left, and the `homerack` extension object each answer carries."""

from __future__ import annotations

import json

from fastapi.responses import JSONResponse

from ..events import Started


def device_of(http) -> str | None:
    """The paired device a request comes from (set by the sharing listener's gate,
    home_door.py); None for the owner's."""
    return getattr(http.state, "device", None)


def extension(started: Started, notes: list[str] = ()) -> dict:
    return {"chat_format": started.chat_format, "notes": [*started.notes, *notes],
            "n_ctx": started.n_ctx, "response_cache": started.response_cache,
            "route": started.route, "adapters": list(started.adapters)}


def cited(turn) -> dict:
    """A grounded turn's `citations` for its answer (nothing when none were asked)."""
    return {"citations": turn.citations} if turn.citations is not None else {}


def openai_error(message: str, kind: str, param: str | None = None) -> dict:
    """OpenAI's error shape (every route but Anthropic's answers errors in it)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": kind}}


def cancelled() -> JSONResponse:
    return JSONResponse(openai_error("client disconnected", "cancelled"), 499)


def sse(payload: dict) -> str:
    """One server-sent event carrying `payload` as JSON."""
    return f"data: {json.dumps(payload)}\n\n"
