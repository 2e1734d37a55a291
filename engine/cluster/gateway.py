"""The worker's LAN port: TLS, then one hello line, then — for a paired host asking for
`rpc` — a byte pipe to llama.cpp's RPC server on 127.0.0.1. An unpaired peer, a wrong
code, a foreign version or a second host while one is served is answered and closed
before a connection to the RPC server is even opened."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from typing import Callable

from .pairing import Grants
from .relay import Half, first_closed, join, no_delay
from .protocol import Refused, code_proof, mismatch, read_line, versions, write_line

BUSY_WAIT_S = 3.0


@dataclass
class GatewayStats:
    refused: int = 0
    rpc_sessions: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    serving: str | None = None   # the host whose RPC session is open
    refusals: list[str] = field(default_factory=list)  # the last reasons, newest last


class Gateway:
    def __init__(self, name: str, grants: Grants, fingerprint: str, rpc_endpoint: str,
                 info: Callable[[], dict], on_paired: Callable[[str], None] = lambda _h: None):
        self.name = name
        self.grants = grants
        self.fingerprint = fingerprint
        self.rpc_endpoint = rpc_endpoint
        self.info = info
        self.on_paired = on_paired
        self.stats = GatewayStats()
        self._session = asyncio.Lock()  # llama.cpp's RPC server serves one client at a time

    async def serve(self, host: str, port: int, context: ssl.SSLContext) -> asyncio.AbstractServer:
        return await asyncio.start_server(self._handle, host, port, ssl=context,
                                          ssl_handshake_timeout=5, limit=1 << 16)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        no_delay(writer)
        try:
            hello = await read_line(reader)
            await self._dispatch(hello, reader, writer)
        except Refused as exc:
            await self._refuse(writer, str(exc))
        except (ConnectionError, ssl.SSLError, asyncio.IncompleteReadError):
            pass
        except asyncio.CancelledError:
            pass  # the worker is stopping: this connection ends with it
        finally:
            writer.close()

    async def _refuse(self, writer: asyncio.StreamWriter, why: str) -> None:
        self.stats.refused += 1
        self.stats.refusals = (self.stats.refusals + [why])[-10:]
        try:
            await write_line(writer, {"ok": False, "error": why, "name": self.name})
        except (ConnectionError, ssl.SSLError):
            pass

    async def _dispatch(self, hello: dict, reader, writer) -> None:
        ours = versions()
        if why := mismatch(ours, hello.get("versions") or {}):
            raise Refused(f"version mismatch with worker {self.name}: {why}")
        mode = hello.get("mode")
        if mode == "pair":
            return await self._pair(hello, writer)
        host = self.grants.admits(hello.get("token"))
        if host is None:
            raise Refused(f"this host is not paired with worker {self.name} "
                          "(pair it with the code the worker shows)")
        if mode == "control":
            return await self._control(reader, writer)
        if mode == "rpc":
            return await self._rpc(host, reader, writer)
        raise Refused(f"unknown mode {mode!r}")

    async def _pair(self, hello: dict, writer) -> None:
        token, why = self.grants.try_code(hello.get("proof"),
                                          lambda code: code_proof(code, self.fingerprint))
        if token is None:
            raise Refused(why)
        host = str(hello.get("host") or "a host")[:64]
        self.grants.grant(token, host)
        self.on_paired(host)
        await write_line(writer, {"ok": True, "token": token, "name": self.name,
                                  "versions": versions()})

    async def _control(self, reader, writer) -> None:
        """Heartbeats: every ping is answered with a pong and this worker's figures."""
        await write_line(writer, {"ok": True, "name": self.name, "versions": versions(),
                                  "info": self.info()})
        while line := await reader.readline():
            if line.strip():
                await write_line(writer, {"pong": line.decode().strip(), "info": self.info()})

    async def _rpc(self, host: str, reader, writer) -> None:
        try:  # the same host's previous session may still be closing
            await asyncio.wait_for(self._session.acquire(), BUSY_WAIT_S)
        except asyncio.TimeoutError:
            raise Refused(f"worker {self.name} is busy: it serves {self.stats.serving}") from None
        try:
            await self._rpc_session(host, reader, writer)
        finally:
            self._session.release()

    async def _rpc_session(self, host: str, reader, writer) -> None:
        address, port = self.rpc_endpoint.rsplit(":", 1)
        try:
            _, server = await asyncio.get_running_loop().create_connection(
                lambda: Half(self._count("bytes_out")), address, int(port))
        except OSError:
            raise Refused(f"worker {self.name}: its llama.cpp RPC server is not running") from None
        self.stats.serving, self.stats.rpc_sessions = host, self.stats.rpc_sessions + 1
        try:
            await write_line(writer, {"ok": True, "name": self.name})
            # the host sends nothing more until it has read the ok: the stream holds nothing
            client = Half(self._count("bytes_in")).adopt(writer.transport)
            join(client, server)
            await first_closed(client, server)
        finally:
            self.stats.serving = None
            server.transport.close()

    def _count(self, counter: str):
        return lambda n: setattr(self.stats, counter, getattr(self.stats, counter) + n)
