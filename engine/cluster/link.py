"""The host's side of a worker: pairing, the heartbeat link, and the local forwarder
llama.cpp's RPC client connects to (127.0.0.1 only), which carries its bytes over TLS to
the worker's gateway and counts them.

When the worker goes (the link breaks, or no heartbeat answer for LOST_AFTER_S), the
forwarder keeps llama.cpp's socket open and silent: llama.cpp would abort the process on
a closed one, a silent one only blocks it, so the engine can answer the request in flight
with an error naming the worker before it restarts (cluster/head.py)."""

from __future__ import annotations

import asyncio
import json
import ssl
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from .identity import client_context, peer_fingerprint
from .pairing import Pairing
from .protocol import (DEFAULT_PORT, HEARTBEAT_S, LOST_AFTER_S, Exchange, Refused, read_line, versions,
                       write_line)
from .relay import Half, first_closed, from_this_process, join, no_delay


def split_address(address: str, default_port: int) -> tuple[str, int]:
    host, _, port = address.rpartition(":") if ":" in address else (address, "", "")
    return host.strip("[]"), int(port) if port else default_port


async def _connect(address: str):
    """TLS to a worker's gateway: (reader, writer, the certificate's fingerprint)."""
    host, port = split_address(address, DEFAULT_PORT)
    try:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(host, port, ssl=client_context(), limit=1 << 16), 3)
    except (OSError, asyncio.TimeoutError, ssl.SSLError) as exc:
        raise ConnectionError(f"no Homerack worker answers at {host}:{port} ({exc})") from None
    no_delay(writer)
    return reader, writer, peer_fingerprint(writer.get_extra_info("ssl_object"))


async def _hello(reader, writer, message: dict) -> dict:
    await write_line(writer, {"versions": versions(), **message})
    answer = await read_line(reader)
    if not answer.get("ok"):
        writer.close()
        raise Refused(answer.get("error") or "refused")
    return answer


async def open_link(address: str, mode: str, pinned: str, token: str):
    """A paired worker's gateway in `mode`, its certificate checked against the pinned
    fingerprint before a byte of ours is sent. Returns (reader, writer, its answer)."""
    reader, writer, seen = await _connect(address)
    if seen != pinned:
        writer.close()
        raise Refused(f"the worker at {address} shows another certificate than the one "
                      "paired (fingerprint changed): pair it again if it was reinstalled")
    answer = await _hello(reader, writer, {"mode": mode, "token": token})
    return reader, writer, answer


async def pair(address: str, code: str, host_name: str) -> tuple[Pairing, str]:
    """Pair with the worker at `address` using the code it shows: the pairing, and the
    six digits both sides show (protocol.Exchange)."""
    reader, writer, seen = await _connect(address)
    exchange = Exchange("host", code, seen)
    try:
        answer = await _hello(reader, writer, {"mode": "pair", "host": host_name,
                                               "pake": exchange.message})
        exchange.finish(answer.get("pake"))
        final = await _hello(reader, writer, {"confirm": exchange.confirmation("host")})
    finally:
        writer.close()
    if not exchange.confirms("worker", final.get("confirm")):
        raise Refused(f"the machine at {address} could not prove it knows the code: it may "
                      "not be the worker you think; nothing was paired")
    host, port = split_address(address, DEFAULT_PORT)
    pairing = Pairing(str(final["name"]), f"{host}:{port}", seen, str(final["token"]))
    return pairing, exchange.comparison()


@dataclass
class LinkStats:
    bytes_sent: int = 0         # host -> worker, RPC only
    bytes_received: int = 0
    round_trips: int = 0        # request/response turns on the RPC link
    rtt_s: float | None = None  # the last heartbeat's round trip
    rtt_min_s: float | None = None  # the least of the recent ones: the link, not the schedulers
    recent: list = field(default_factory=list)

    def add_rtt(self, seconds: float) -> None:
        self.rtt_s = seconds
        self.recent = (self.recent + [seconds])[-20:]
        self.rtt_min_s = min(self.recent)


class WorkerLink:
    """One paired worker: heartbeat, forwarder, figures. Lives on a LinkLoop."""

    def __init__(self, pairing: Pairing, on_lost: Callable[["WorkerLink", str], None]):
        self.pairing = pairing
        self.on_lost = on_lost
        self.stats = LinkStats()
        self.info: dict = {}
        self.lost: str | None = None
        self.endpoint: str | None = None   # where llama.cpp connects (127.0.0.1:port)
        self._server: asyncio.AbstractServer | None = None
        self._control: asyncio.StreamWriter | None = None
        self._held: list[Half] = []  # llama.cpp's connections, kept open (and silent) when lost
        self._awaiting = False  # llama.cpp sent a request the worker has not answered yet
        self._tasks: set[asyncio.Task] = set()  # asyncio keeps only weak references to them

    @property
    def name(self) -> str:
        return self.pairing.name

    async def start(self) -> None:
        """Check the worker (version, pairing) and open the forwarder."""
        reader, writer, answer = await open_link(self.pairing.address, "control",
                                                    self.pairing.fingerprint, self.pairing.token)
        self.info = answer.get("info", {})
        self._control = writer
        self._server = await asyncio.get_running_loop().create_server(
            lambda: Half(self._sent, on_made=self._accept), "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.endpoint = f"127.0.0.1:{port}"
        self._tasks.add(asyncio.get_running_loop().create_task(self._heartbeat(reader, writer)))

    async def _heartbeat(self, reader, writer) -> None:
        while self.lost is None:
            sent = time.monotonic()
            try:
                await write_line(writer, {"t": sent})
                line = await asyncio.wait_for(reader.readline(), LOST_AFTER_S - HEARTBEAT_S)
                if not line:
                    raise ConnectionError("closed")
                self.info = json.loads(line).get("info", self.info)
            except asyncio.TimeoutError:  # (an OSError too, since Python 3.11: first)
                self._lose(f"worker {self.name} ({self.pairing.address}) stopped answering "
                           f"for {LOST_AFTER_S:.1f} s")
                return
            except (OSError, ValueError, ssl.SSLError):
                self._lose(f"worker {self.name} ({self.pairing.address}) closed the link")
                return
            self.stats.add_rtt(time.monotonic() - sent)
            await asyncio.sleep(max(0.0, HEARTBEAT_S - self.stats.rtt_s))

    def _lose(self, why: str) -> None:
        if self.lost is None:
            self.lost = why
            self.on_lost(self, why)

    def _accept(self, local: Half) -> None:
        task = asyncio.get_running_loop().create_task(self._carry(local))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _sent(self, n: int) -> None:
        self.stats.bytes_sent += n
        self._awaiting = True

    def _received(self, n: int) -> None:
        self.stats.bytes_received += n
        if self._awaiting:
            self.stats.round_trips, self._awaiting = self.stats.round_trips + 1, False

    async def _carry(self, local: Half) -> None:
        """One connection of llama.cpp's, carried to the worker's RPC server."""
        if not from_this_process(local.transport.get_extra_info("peername"),
                                 local.transport.get_extra_info("sockname")):
            local.transport.close()  # another local program: it has no pairing of its own
            return
        if self.lost:
            self._hold(local)
            return
        try:
            _, writer, _ = await open_link(self.pairing.address, "rpc", self.pairing.fingerprint,
                                           self.pairing.token)
        except (Refused, ConnectionError) as exc:
            self._hold(local)
            self._lose(f"worker {self.name}: {exc}")
            return
        remote = Half(self._received).adopt(writer.transport)
        join(local, remote)
        if await first_closed(local, remote) is local:
            remote.transport.close()  # llama.cpp closed its side: a clean end
            return
        self._hold(local)
        self._lose(f"worker {self.name} ({self.pairing.address}) was lost: the link closed")

    def _hold(self, local: Half) -> None:
        local.detach()
        self._held.append(local)

    async def stop(self) -> None:
        """A clean end (no loss reported): the forwarder, the heartbeat, the link."""
        self.lost = self.lost or "stopped"
        if self._server:
            self._server.close()
        if self._control:
            self._control.close()
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop where it exists: its TLS is compiled, asyncio's is Python, and every relayed
    RPC message crosses it twice (bench/cluster.py measures the gateway's cost)."""
    try:
        import uvloop
    except ImportError:  # Windows
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class LinkLoop:
    """An asyncio loop on its own thread for every link of this process."""

    def __init__(self):
        self.loop = new_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="homerack-links",
                                        daemon=True)
        self._thread.start()

    def run(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
