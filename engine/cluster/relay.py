"""Byte relays between two connections with one callback a chunk: each side's protocol
writes what it receives straight to the other side's transport. (Streams would add a
buffer and a task wake-up to every chunk; llama.cpp's RPC sends small messages both ways,
about two round trips per remote stage and token, each crossing four relays.)"""

from __future__ import annotations

import asyncio
import socket
from typing import Callable


class Half(asyncio.Protocol):
    """One connection of a relay. Before it is joined to its peer, what arrives waits."""

    def __init__(self, on_data: Callable[[int], None] = lambda _n: None,
                 on_made: Callable[["Half"], None] = lambda _h: None):
        self.on_data, self.on_made = on_data, on_made
        self.transport: asyncio.Transport | None = None
        self.peer: Half | None = None
        self.pending: list[bytes] = []
        self.closed = asyncio.get_running_loop().create_future()

    def adopt(self, transport: asyncio.Transport) -> "Half":
        """Take over a connection that began as a stream (after the hello lines)."""
        self.transport = transport
        transport.set_protocol(self)
        return self

    def connection_made(self, transport) -> None:
        self.transport = transport
        no_delay(transport)
        self.on_made(self)

    def data_received(self, data: bytes) -> None:
        self.on_data(len(data))
        if self.peer is None:
            self.pending.append(data)
        else:
            self.peer.transport.write(data)

    def connection_lost(self, exc) -> None:
        if not self.closed.done():
            self.closed.set_result(exc)

    def pause_writing(self) -> None:  # our transport is full: stop reading the other side
        if self.peer:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer:
            self.peer.transport.resume_reading()

    def detach(self) -> None:
        """Keep the connection open but carry nothing more (see link.py: a silent socket
        blocks llama.cpp where a closed one would abort it)."""
        self.peer = None
        self.transport.pause_reading()


def join(a: Half, b: Half) -> None:
    a.peer, b.peer = b, a
    for half in (a, b):
        for data in half.pending:
            half.peer.transport.write(data)
        half.pending.clear()


async def first_closed(a: Half, b: Half) -> Half:
    """Wait until either side closes; returns the one that did."""
    done, _ = await asyncio.wait([a.closed, b.closed], return_when=asyncio.FIRST_COMPLETED)
    return a if a.closed in done else b


def no_delay(transport_or_writer) -> None:
    """RPC is request/response in small messages: Nagle's algorithm would hold each one
    back until the previous one's (delayed) ACK."""
    sock = transport_or_writer.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def from_this_process(peer: tuple, ours: tuple) -> bool:
    """Whether the loopback connection from `peer` to `ours` (host, port each) was opened
    by this process (llama.cpp in the engine): a forwarder carries a paired session, so no
    other local program may use it. Asked of psutil, which answers for this process's own
    sockets on Linux, macOS and Windows; where it cannot tell, no (fail closed)."""
    import psutil

    try:
        connections = psutil.Process().net_connections(kind="tcp")
    except (psutil.Error, OSError, NotImplementedError):
        return False
    return any(tuple(c.laddr)[:2] == tuple(peer)[:2] and c.raddr
               and tuple(c.raddr)[:2] == tuple(ours)[:2] for c in connections)
