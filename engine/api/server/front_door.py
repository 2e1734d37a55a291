"""The front door to the household's replicas (cluster/replicas.py): a generation request
(OpenAI chat and completions, Anthropic messages, Responses) is answered here or sent to
the paired machine that should answer it, chosen by `replicas.choose` from the machines'
models, queues and speeds and the conversation's last machine. A request may name its
machine (`X-Homerack-Machine`). The chosen replica's answer comes back byte for byte,
streamed or not; every answer names its machine in `X-Homerack-Machine`.

A replica that cannot be reached, or is lost (its heartbeats stop: replicas.py), before
its answer starts is left out and the request goes to the next choice: nothing is lost.
One that goes during a stream ends it with an error event naming the machine (the app's
history keeps what arrived).

A pure ASGI middleware inside the guard (a body's size is capped before it is read
here); the token is checked before anything is forwarded, so an unauthenticated request
never reaches a replica with this host's credentials."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Callable

import httpx

from ...cluster.replicas import Replicas, opening_key
from ...engine import Engine
from .guard import asgi_headers, replayed
from ..wire import is_anthropic

ROUTES = frozenset({"/v1/chat/completions", "/v1/completions", "/v1/messages", "/v1/responses"})
HEADER = "x-homerack-machine"
HOP_HEADERS = {"host", "authorization", "x-api-key", "content-length", "connection",
               "transfer-encoding", "keep-alive"}
CONNECT_TIMEOUT_S = 5.0
WATCH_S = 0.2  # how often a wait on a replica checks that it is still there


class ReplicaLost(Exception):
    pass


class FrontDoor:
    def __init__(self, app, engine: Engine, replicas: Replicas,
                 token_given: Callable[[dict], bool]):
        self.app, self.engine, self.replicas = app, engine, replicas
        self.token_given = token_given
        self.here = socket.gethostname()
        self._clients: dict[str, httpx.AsyncClient] = {}  # per tunnel: its connections kept

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] != "POST" or scope["path"] not in ROUTES:
            return await self.app(scope, receive, send)
        body = await _read(receive)
        headers = asgi_headers(scope)
        request = _json(body)
        if not self.token_given(headers) or request is None or \
                not isinstance(request.get("model"), str):
            return await self.app(scope, replayed(body, receive), send)  # the routes answer
        key = opening_key(request)
        for name in self._replicas_to_try(request["model"], key, headers.get(HEADER)):
            self.replicas.begin(name)
            try:
                if await self._forward(name, scope, headers, body, send):
                    self.replicas.remember(key, name)
                    return
            finally:
                self.replicas.end(name)
        self.replicas.remember(key, self.here)
        self.replicas.begin(self.here)
        try:
            await self.app(scope, replayed(body, receive), _naming(send, self.here))
        finally:
            self.replicas.end(self.here)

    def _replicas_to_try(self, model: str, key: str | None, wanted: str | None):
        """The replicas to send the request to in turn (each one that cannot be reached
        is left out before the next choice); this machine answers after them."""
        if wanted:
            if wanted in self.replicas.loads:
                yield wanted
            return
        for _ in self.replicas.pairings:
            machine = self.replicas.choose(model, key, self.engine.machine_load(self.here))
            if machine is None or machine.local:
                return
            yield machine.name

    async def _forward(self, name: str, scope, headers: dict, body: bytes, send) -> bool:
        """The request answered by replica `name`; False when it could not be reached
        before its answer began (then nothing was sent to the client)."""
        tunnel = self.replicas.tunnel(name)
        if tunnel is None or not tunnel.url:
            return False
        ahead = {k: v for k, v in headers.items() if k not in HOP_HEADERS | {HEADER}}
        ahead["authorization"] = f"Bearer {tunnel.token}"
        client = self._client(tunnel.url)
        try:
            reply = await self._watched(name, client.send(client.build_request(
                "POST", scope["path"], content=body, headers=ahead), stream=True))
        except (httpx.HTTPError, ReplicaLost) as exc:
            await self._drop_client(tunnel.url)
            self.replicas.lose(name, str(exc) if isinstance(exc, ReplicaLost) else
                               f"replica {name} could not be reached: {exc!r}")
            return False
        try:
            await send({"type": "http.response.start", "status": reply.status_code,
                        "headers": _answer_headers(reply, name)})
            chunks = reply.aiter_raw()
            try:
                while True:
                    chunk = await self._watched(name, anext(chunks, None))
                    if chunk is None:
                        break
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except (httpx.HTTPError, ReplicaLost) as exc:
                why = f"machine {name} was lost while answering: {exc}"
                self.replicas.lose(name, why)
                await self._drop_client(tunnel.url)
                await send({"type": "http.response.body", "more_body": True,
                            "body": _stream_error(scope["path"], reply, why)})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await reply.aclose()
        return True

    def _client(self, url: str) -> httpx.AsyncClient:
        """The tunnel's client (its connections reused: each new one is a TLS link to
        the worker's gateway)."""
        if url not in self._clients:
            self._clients[url] = httpx.AsyncClient(
                base_url=url, timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT_S))
        return self._clients[url]

    async def _drop_client(self, url: str) -> None:
        """After a failure: its pooled connections may lead to a machine that is gone."""
        client = self._clients.pop(url, None)
        if client is not None:
            await client.aclose()

    async def _watched(self, name: str, step):
        """`step`'s result, unless the replica is lost first (ReplicaLost, step cancelled)."""
        task = asyncio.ensure_future(step)
        while True:
            done, _ = await asyncio.wait({task}, timeout=WATCH_S)
            if done:
                return task.result()
            if why := self.replicas.lost(name):
                task.cancel()
                raise ReplicaLost(why)


def _answer_headers(reply: httpx.Response, name: str) -> list[tuple[bytes, bytes]]:
    kept = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in reply.headers.items()
            if k.lower() not in HOP_HEADERS | {HEADER}]
    return kept + [(HEADER.encode(), name.encode("latin-1", "replace"))]


def _stream_error(path: str, reply: httpx.Response, why: str) -> bytes:
    """The last event of a stream whose machine went: the route family's error shape."""
    if "text/event-stream" not in reply.headers.get("content-type", ""):
        return b""
    if is_anthropic(path):
        error = {"type": "error", "error": {"type": "api_error", "message": why}}
        return f"event: error\ndata: {json.dumps(error)}\n\n".encode()
    return f"data: {json.dumps({'error': {'message': why, 'type': 'server_error'}})}\n\n".encode()


def _naming(send, name: str):
    async def named(message):
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()),
                                              (HEADER.encode(), name.encode("latin-1", "replace"))]}
        await send(message)
    return named


async def _read(receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _json(body: bytes) -> dict | None:
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None
