"""The MCP servers running for this engine, on one event loop thread of their own: each
started on demand (a stdio program, or a Streamable HTTP session), stopped when idle,
started again when it died; its stderr in a log the user can open. Every wait has a limit:
a server that does not start or answer in time is reported and stopped, never a hung
chat. Callers on any thread use `tools` and `call`, which block their own thread only."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

from ..errors import ToolServerFailed
from ..outbound import async_client
from .calls import MAX_RESULT_CHARS, ToolResult, error_result, result_of
from .config import ServerSpec, with_secrets

log = logging.getLogger("homerack")
START_S = 30.0      # to start and list its tools
PING_S = 5.0        # a server idle a while is pinged before a call: dead ones restart
IDLE_S = 600.0      # stopped after this long unused
LOG_TAIL = 600      # characters of its log in an error


@dataclass
class _Server:
    spec: ServerSpec
    state: str = "stopped"  # stopped, starting, ready, failed
    error: str | None = None
    session: object = None
    tools: list = field(default_factory=list)
    last_used: float = 0.0
    starts: int = 0
    stop: asyncio.Event | None = None
    task: asyncio.Task | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class ToolServers:
    def __init__(self, logs: Path | None, idle_s: float = IDLE_S, start_s: float = START_S):
        self.logs, self.idle_s, self.start_s = logs, idle_s, start_s
        self._servers: dict[str, _Server] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp", daemon=True)
        self._thread.start()
        self._reaper = self._run(self._reap(), None, wait=False)

    # -- for callers on any thread -----------------------------------------------------

    def tools(self, spec: ServerSpec) -> list:
        """The server's tools (MCP `Tool`s), starting it when it is not running."""
        return self._run(self._tools(spec), self.start_s + PING_S + 5)

    def call(self, spec: ServerSpec, name: str, arguments: dict,
             max_chars: int = MAX_RESULT_CHARS) -> ToolResult:
        """Run a tool: its result, or an error result saying why (never raises for the
        server's failures: the model is told)."""
        return self._run(self._call(spec, name, arguments, max_chars),
                         self.start_s + spec.timeout_s + PING_S + 10)

    def status(self) -> dict[str, dict]:
        return {label: {"state": s.state, "error": s.error, "starts": s.starts,
                        "tools": len(s.tools), "log": str(self.log_path(label) or "")}
                for label, s in list(self._servers.items())}

    def stop(self, label: str) -> None:
        server = self._servers.get(label)
        if server:
            self._run(self._stop(server), 10)

    def close(self) -> None:
        try:
            self._reaper.cancel()
            self._run(self._stop_all(), 15)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def log_path(self, label: str) -> Path | None:
        return self.logs / f"{label}.log" if self.logs else None

    def _run(self, coroutine, timeout: float | None, wait: bool = True):
        future = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        return future.result(timeout) if wait else future

    # -- on the servers' loop ------------------------------------------------------------

    def _server(self, spec: ServerSpec) -> _Server:
        key = _key(spec)
        server = self._servers.get(key)
        if server is None or server.spec != spec:  # a changed configuration is another one
            if server is not None:
                asyncio.ensure_future(self._stop(server))
            server = self._servers[key] = _Server(spec)
        return server

    async def _tools(self, spec: ServerSpec) -> list:
        server = self._server(spec)
        await self._ready_or_evicted(server)
        return list(server.tools)

    async def _ready_or_evicted(self, server: _Server) -> None:
        """_ready; a request's server that fails is forgotten (each URL a request names
        would otherwise stay listed for ever)."""
        try:
            await self._ready(server)
        except ToolServerFailed:
            if server.spec.from_request:
                self._servers.pop(_key(server.spec), None)
            raise

    async def _call(self, spec: ServerSpec, name: str, arguments: dict,
                    max_chars: int) -> ToolResult:
        server = self._server(spec)
        try:
            await self._ready_or_evicted(server)
        except ToolServerFailed as exc:
            return error_result(exc.message)
        if not any(t.name == name for t in server.tools):
            return error_result(f"{spec.label} has no tool {name!r}")
        started = time.monotonic()
        server.last_used = started
        try:
            result = await server.session.call_tool(
                name, arguments, read_timeout_seconds=timedelta(seconds=spec.timeout_s))
        except Exception as exc:  # noqa: BLE001 - a timeout, a closed pipe: the model is told
            await self._stop(server)
            if spec.from_request:
                self._servers.pop(_key(spec), None)
            why = "did not answer" if "timed out" in str(exc).lower() or \
                isinstance(exc, TimeoutError) else f"failed ({_said(exc)})"
            return error_result(
                f"The tool server {spec.label} {why} within {spec.timeout_s:g} s; it was "
                f"stopped and starts again on the next call.{self._tail(spec.label)}",
                time.monotonic() - started)
        server.last_used = time.monotonic()
        return result_of(result, server.last_used - started, max_chars)

    async def _ready(self, server: _Server) -> None:
        async with server.lock:
            if server.state == "ready" and time.monotonic() - server.last_used > PING_S:
                try:  # still alive? (a crashed stdio server is started again)
                    await asyncio.wait_for(server.session.send_ping(), PING_S)
                except Exception:  # noqa: BLE001 - any failure: it is not
                    await self._stop(server)
            if server.state != "ready":
                await self._start(server)

    async def _start(self, server: _Server) -> None:
        server.state, server.error, server.starts = "starting", None, server.starts + 1
        server.stop = asyncio.Event()
        ready = asyncio.get_running_loop().create_future()
        server.task = asyncio.ensure_future(self._live(server, ready))
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.start_s)
        except asyncio.TimeoutError:
            server.task.cancel()
            server.state = "failed"
            server.error = f"did not start within {self.start_s:g} s"
        except Exception as exc:  # noqa: BLE001 - said in words below
            server.state, server.error = "failed", _said(exc)
        if server.state != "ready":
            raise ToolServerFailed(f"The tool server {server.spec.label} "
                                   f"{server.error}.{self._tail(server.spec.label)}")
        server.last_used = time.monotonic()

    async def _live(self, server: _Server, ready: asyncio.Future) -> None:
        """The server's whole life in one task: anyio's scopes are entered and left here."""
        from mcp import ClientSession

        try:
            async with AsyncExitStack() as stack:
                read, write = await self._transport(stack, with_secrets(server.spec))
                session = await stack.enter_async_context(ClientSession(
                    read, write, read_timeout_seconds=timedelta(seconds=self.start_s)))
                await session.initialize()
                server.tools = await _all_tools(session)
                server.session, server.state = session, "ready"
                ready.set_result(None)
                await server.stop.wait()
        except BaseException as exc:  # noqa: BLE001 - any end of the server is reported
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else
                                    RuntimeError("stopped while starting"))
            if server.state == "ready":
                server.error = _said(exc)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            server.session = None
            if server.state == "ready":
                server.state = "stopped"

    async def _transport(self, stack: AsyncExitStack, spec: ServerSpec):
        if spec.url:
            import httpx
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client
            timeout = httpx.Timeout(self.start_s, read=spec.timeout_s)
            # a request's server: every connection checked and pinned (outbound.py)
            client = await stack.enter_async_context(
                async_client(spec.allowed_hosts, headers=dict(spec.headers) or None,
                             timeout=timeout, follow_redirects=True, max_redirects=3)
                if spec.from_request else
                create_mcp_http_client(headers=dict(spec.headers) or None, timeout=timeout))
            read, write, _ = await stack.enter_async_context(
                streamable_http_client(spec.url, http_client=client))
            return read, write
        from mcp import StdioServerParameters
        from mcp.client.stdio import stdio_client
        errlog = stack.enter_context(self._open_log(spec.label))
        # the SDK's default environment (PATH, HOME, USER, ...) and what the user named
        params = StdioServerParameters(command=spec.command, args=list(spec.args),
                                       env=dict(spec.env) or None, cwd=spec.cwd)
        return await stack.enter_async_context(stdio_client(params, errlog=errlog))

    def _open_log(self, label: str):
        path = self.log_path(label)
        if path is None:
            return open(os.devnull, "w")
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("a", encoding="utf-8")
        handle.write(f"--- started {time.strftime('%Y-%m-%d %H:%M:%S')}\n")
        handle.flush()
        return handle

    def _tail(self, label: str) -> str:
        path = self.log_path(label)
        try:
            text = path.read_text(encoding="utf-8", errors="replace") if path else ""
        except OSError:
            return ""
        last = text[text.rfind("--- started"):].split("\n", 1)[-1].strip()
        return f" Its log ends: {last[-LOG_TAIL:]}" if last else ""

    async def _stop(self, server: _Server) -> None:
        if server.stop is not None:
            server.stop.set()
        if server.task is not None and not server.task.done():
            try:
                await asyncio.wait_for(asyncio.shield(server.task), 8)
            except (asyncio.TimeoutError, Exception):  # noqa: BLE001 - stopping regardless
                server.task.cancel()
        server.state, server.session = "stopped", None

    async def _stop_all(self) -> None:
        await asyncio.gather(*(self._stop(s) for s in list(self._servers.values())),
                             return_exceptions=True)

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(min(30.0, self.idle_s))
            now = time.monotonic()
            for server in list(self._servers.values()):
                if server.state == "ready" and now - server.last_used > self.idle_s:
                    await self._stop(server)
                    if server.spec.from_request:  # a request's: gone, not kept stopped
                        self._servers.pop(_key(server.spec), None)


def _key(spec: ServerSpec) -> str:
    # a server a request names never takes the place of the user's of that name
    return f"request:{spec.identity}" if spec.from_request else spec.label


async def _all_tools(session) -> list:
    tools, cursor = [], None
    for _ in range(50):  # pages; a server paging forever is cut off
        page = await session.list_tools(cursor=cursor)
        tools += page.tools
        cursor = page.nextCursor
        if not cursor:
            break
    return tools


def _said(exc: BaseException) -> str:
    """An exception in words (an ExceptionGroup: its first leaf)."""
    while getattr(exc, "exceptions", None):
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return text if len(text) < 300 else text[:300] + "…"
