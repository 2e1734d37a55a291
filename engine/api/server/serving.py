"""Runs the engine API with uvicorn on a socket bound here, so port 0 picks a free port
and the real address is known before the first request."""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import sys
from dataclasses import dataclass
from typing import Callable

import uvicorn

from .factory import create_app, create_ollama_app
from .guard import LOOPBACK_NAMES, host_name
from .listeners import BesideServer, bind, open_files
from ...engine import Engine


@dataclass(frozen=True)
class ServeConfig:
    host: str = "127.0.0.1"
    port: int = 0
    token: str = ""
    fd: int | None = None  # a socket already listening, handed over by a supervisor
    api_docs: bool = False  # serve /openapi.json and /docs
    generation_only: bool = False  # a worker's replica engine (factory.GENERATION_ONLY)
    ollama_port: int | None = None  # Ollama's routes without the token on 127.0.0.1 here
    share: tuple[str, int] | None = None  # (host, port): also serve the home's devices

    def host_names(self) -> frozenset[str]:
        """The name requests may address the engine by besides loopback and IP literals."""
        return frozenset() if is_loopback(self.host) or self.host in ("0.0.0.0", "::") \
            else frozenset({host_name(self.host)})


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host_name(host)).is_loopback
    except ValueError:
        return host_name(host) in LOOPBACK_NAMES


def serve(engine: Engine, config: ServeConfig, on_ready: Callable[[str], None],
          routers: tuple = (), holder: dict | None = None) -> None:
    """Blocks until the server stops (Ctrl+C or SIGTERM). `routers`: more routes, under
    the same token. `holder` receives "stop_accepting": a callable that closes this
    process's listening socket (a supervisor's copy keeps new clients waiting)."""
    open_files()  # its soft limit raised to the hard one: connections are files too
    sock = socket.socket(fileno=config.fd) if config.fd is not None else \
        bind(config.host, config.port)
    host, port = sock.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    loop = {}

    beside = _ollama_door(engine, config.ollama_port)

    def started() -> None:
        loop["loop"] = asyncio.get_running_loop()
        if beside is not None:
            loop["ollama"] = loop["loop"].create_task(beside[0].serve(sockets=[beside[1]]))
        if config.share is not None:
            loop["share"] = loop["loop"].create_task(_share(app.state.door, *config.share))
        on_ready(url)

    app = create_app(engine, config.token, on_startup=started, routers=routers,
                     api_docs=config.api_docs, host_names=config.host_names(),
                     generation_only=config.generation_only)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False,
                                           timeout_graceful_shutdown=2))
    if holder is not None:
        holder["stop_accepting"] = lambda: loop["loop"].call_soon_threadsafe(
            lambda: [listener.close() for listener in server.servers])
    try:
        server.run(sockets=[sock])
    finally:
        engine.close()


async def _share(door, host: str, port: int) -> None:
    try:
        print(f"sharing with this home on {await door.open(host, port)}", file=sys.stderr,
              flush=True)
    except Exception as exc:  # said; the owner's engine serves on
        print(f"not shared with this home: {host}:{port}: "
              f"{getattr(exc, 'strerror', None) or exc}", file=sys.stderr, flush=True)


def _ollama_door(engine: Engine, port: int | None):
    """(server, socket) of Ollama's routes without the token on 127.0.0.1:`port`; None
    when not asked, or when the port is taken (Ollama itself may run there): said, and
    the engine serves on without it."""
    if port is None:
        return None
    try:
        sock = bind("127.0.0.1", port)
    except OSError as exc:
        print(f"Ollama's API is not served on 127.0.0.1:{port} without a token: "
              f"{exc.strerror} (is Ollama running?)", file=sys.stderr, flush=True)
        return None
    print(f"Ollama's API without a token on http://127.0.0.1:{port}", file=sys.stderr,
          flush=True)
    server = BesideServer(uvicorn.Config(create_ollama_app(engine), log_level="warning",
                                    access_log=False, timeout_graceful_shutdown=2))
    return server, sock

