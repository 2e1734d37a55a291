"""The worker's LAN port: TLS, then one hello line, then — for a paired host asking for
`rpc` — a byte pipe to llama.cpp's RPC server on 127.0.0.1, or for `api` one to the
worker's replica engine (its own Homerack engine, with whole models: cluster/replicas.py). An unpaired peer, a wrong
code, pairing while it is closed, a foreign version or a second host while one is served
is answered and closed before a connection to the RPC server is even opened; and bytes
are relayed only to a server that is the worker's own child (`rpc_owner`)."""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass, field
from typing import Callable

from .pairing import Grants, PairingWindow
from .relay import Half, first_closed, join, no_delay
from .protocol import Exchange, Refused, mismatch, read_line, versions, write_line

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
    """`rpc_endpoint()`: where the RPC server listens now (a new port at each restart);
    `rpc_owner(port)`: whether the worker's own RPC server holds that port (another
    local user's process could have taken it while the server restarted)."""

    def __init__(self, name: str, grants: Grants, window: PairingWindow, fingerprint: str,
                 rpc_endpoint: Callable[[], str], rpc_owner: Callable[[int], bool],
                 info: Callable[[], dict],
                 on_paired: Callable[[str, str], None] = lambda _h, _c: None,
                 replica=None):
        self.name = name
        self.grants, self.window = grants, window
        self.fingerprint = fingerprint
        self.rpc_endpoint, self.rpc_owner = rpc_endpoint, rpc_owner
        self.info = info
        self.on_paired = on_paired
        self.replica = replica  # worker.ReplicaEngine, when this machine serves whole models
        self.stats = GatewayStats()
        self._session = asyncio.Lock()  # llama.cpp's RPC server serves one client at a time
        self._pairing = asyncio.Lock()  # one exchange at a time: each guess is counted

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
            return await self._pair(hello, reader, writer)
        host = self.grants.admits(hello.get("token"))
        if host is None:
            raise Refused(f"this host is not paired with worker {self.name} "
                          "(pair it with the code the worker shows)")
        if mode == "control":
            return await self._control(reader, writer)
        if mode == "rpc":
            return await self._rpc(host, reader, writer)
        if mode == "api":
            return await self._api(writer)
        raise Refused(f"unknown mode {mode!r}")

    async def _pair(self, hello: dict, reader, writer) -> None:
        """The exchange (protocol.Exchange): the host's message, ours, the host's
        confirmation — any other end of a started exchange counts as a wrong code —, then
        ours with the token."""
        async with self._pairing:
            exchange = Exchange("worker", self.window.current(), self.fingerprint)
            try:
                exchange.finish(hello.get("pake"))
                await write_line(writer, {"ok": True, "pake": exchange.message,
                                          "name": self.name})
                confirmed = exchange.confirms("host", (await read_line(reader)).get("confirm"))
            except (Refused, ConnectionError, ssl.SSLError):
                confirmed = False
            if not confirmed:
                left = self.window.failed()
                raise Refused("wrong pairing code" + (f" ({left} tries left)" if left else
                              "; pairing is closed now: open it again on the worker for a "
                              "new code"))
            self.window.close()  # one host per window
            host = str(hello.get("host") or "a host")[:64]
            token = self.grants.grant(host)
            self.on_paired(host, exchange.comparison())
            await write_line(writer, {"ok": True, "confirm": exchange.confirmation("worker"),
                                      "token": token, "name": self.name,
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
        address, port = self.rpc_endpoint().rsplit(":", 1)
        if not await asyncio.to_thread(self.rpc_owner, int(port)):
            raise Refused(f"worker {self.name}: its llama.cpp RPC server is not running")
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

    async def _api(self, writer) -> None:
        """A connection to the replica engine (many at once: it queues requests itself);
        the ok carries the engine's token, which only paired hosts learn."""
        replica = self.replica
        port = replica.port if replica else None
        if port is None or not await asyncio.to_thread(replica.owns, port):
            raise Refused(f"worker {self.name} serves no models (start it with --replica)")
        try:
            _, engine = await asyncio.get_running_loop().create_connection(
                Half, "127.0.0.1", port)
        except OSError:
            raise Refused(f"worker {self.name}: its replica engine is not running") from None
        try:
            await write_line(writer, {"ok": True, "name": self.name,
                                      "engine_token": replica.token})
            client = Half().adopt(writer.transport)
            join(client, engine)
            await first_closed(client, engine)
        finally:
            engine.transport.close()

    def _count(self, counter: str):
        return lambda n: setattr(self.stats, counter, getattr(self.stats, counter) + n)
