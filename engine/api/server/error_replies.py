"""Errors answered in the shape of the API a route belongs to (OpenAI's, Anthropic's or
Ollama's), with their status and, for a request to retry, Retry-After: one place for
every app the engine serves (the owner's, Ollama's alone, the home's)."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from ...errors import HomerackError, ModelNotFound
from ..wire import error_body
from .guard import BodyTooLarge


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON: {first.get('msg')}", None
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    return f"{param or 'body'}: {first.get('msg')}", param


def _error_response(request: Request, status: int, message: str, kind: str,
                    param: str | None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(request.url.path, status, message, kind, param), status,
                        headers=headers)


def answer_errors(app: FastAPI, devices: bool = False) -> None:
    """Every error answered in its route's API's shape, with its status. `devices`: the
    sharing listener's, whose answers name only what a device may see (no model but the
    shared ones, no exception's text; the owner's log keeps the whole of it)."""
    @app.exception_handler(HomerackError)
    async def _homerack_error(request: Request, exc: HomerackError):
        retry = getattr(exc, "retry_after_s", None)  # QueueFull, RateLimited
        headers = {"Retry-After": str(retry)} if retry is not None else None
        message = exc.message
        if devices and isinstance(exc, ModelNotFound):  # its text lists every local model
            message = "no model of that name is shared with this home's devices"
        elif devices and exc.status >= 500:
            logging.getLogger("homerack").warning("a device's %s %s failed: %s",
                                                  request.method, request.url.path, message)
            message = f"the engine could not answer this request ({exc.kind})"
        return _error_response(request, exc.status, message, exc.kind, exc.param, headers)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception):
        """A bug, answered in the route's error shape (the engine goes on serving)."""
        logging.getLogger("homerack").exception("%s %s failed", request.method, request.url.path)
        told = "internal error" if devices else f"internal error: {type(exc).__name__}: {exc}"
        return _error_response(request, 500, told, "server_error", None)

    @app.exception_handler(BodyTooLarge)
    async def _too_large(request: Request, exc: BodyTooLarge):
        return _error_response(request, 413, exc.detail, "invalid_request_error", None)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return _error_response(request, 400, message, "invalid_request_error", param)
