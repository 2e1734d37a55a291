"""A small client of the engine API for the CLI and the desktop app."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Iterator

import httpx

from .engine_proc import EngineAddress


class EngineError(Exception):
    """The engine answered with an error (its message is for people)."""


@dataclass
class Reply:
    """Filled in as a streamed reply arrives."""
    text: str = ""
    finish_reason: str | None = None
    usage: dict | None = None
    notes: list[str] = field(default_factory=list)
    n_ctx: int | None = None


class EngineClient:
    def __init__(self, address: EngineAddress, timeout: float = 600.0):
        self.address = address
        self._http = httpx.Client(base_url=address.url, timeout=timeout,
                                  headers={"Authorization": f"Bearer {address.token}"})

    def models(self) -> list[dict]:
        return self._checked(self._http.get("/v1/models")).json()["data"]

    def health(self) -> dict:
        return self._checked(self._http.get("/health", timeout=5)).json()

    def plan(self, model: str, n_ctx: int | None = None, gpu_layers: int | None = None) -> dict:
        """What loading `model` with these choices would use (nothing is loaded)."""
        body = {"model": model, "n_ctx": n_ctx, "gpu_layers": gpu_layers}
        return self._checked(self._http.post("/v1/plan", json=body)).json()

    def load(self, model: str, n_ctx: int | None = None, gpu_layers: int | None = None) -> dict:
        """Load `model` with these choices; the engine's status once it is loaded."""
        body = {"model": model, "n_ctx": n_ctx, "gpu_layers": gpu_layers}
        return self._checked(self._http.post("/v1/models/load", json=body)).json()

    def stream_chat(self, messages: list[dict], reply: Reply,
                    should_stop: Callable[[], bool] = lambda: False, **options) -> Iterator[str]:
        """Yield text pieces as they arrive; `reply` gets the finish reason and usage.
        When should_stop() turns true the stream is closed, which cancels the generation."""
        body = {"messages": messages, "stream": True,
                "stream_options": {"include_usage": True},
                **{k: v for k, v in options.items() if v is not None}}
        with self._http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                self._checked(response)
            for line in response.iter_lines():
                if should_stop():
                    reply.finish_reason = "stopped"
                    return
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise EngineError(chunk["error"]["message"])
                extension = chunk.get("homerack", {})
                reply.notes.extend(extension.get("notes", []))
                reply.n_ctx = extension.get("n_ctx", reply.n_ctx)
                if chunk.get("usage"):
                    reply.usage = chunk["usage"]
                for choice in chunk["choices"]:
                    reply.finish_reason = choice.get("finish_reason") or reply.finish_reason
                    text = choice["delta"].get("content")
                    if text:
                        reply.text += text
                        yield text

    @staticmethod
    def _checked(response: httpx.Response) -> httpx.Response:
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text
            raise EngineError(f"{response.status_code}: {message}")
        return response

    def close(self) -> None:
        self._http.close()
