"""Listening sockets and the servers beside the main one: bound here (port 0 picks a free
port, and the real address is known before the first request), served by uvicorn on the
main server's event loop."""

from __future__ import annotations

import contextlib
import socket
from collections import Counter

import uvicorn


def bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # early clients wait in the backlog until uvicorn accepts
    return sock



def open_files() -> int:
    """The process's open-file limit, its soft limit first raised to the hard one (many
    systems start processes at 1,024 with room above it)."""
    try:
        import resource
    except ImportError:  # Windows: no such limit to raise
        return 8192
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        try:
            wanted = 1 << 20 if hard == resource.RLIM_INFINITY else hard
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return soft


class BesideServer(uvicorn.Server):
    """A second server on the main one's event loop: the main one takes the signals."""
    @contextlib.contextmanager
    def capture_signals(self):
        yield


class DoorCaps:
    """What the sharing listener lets the LAN hold: connections in all and from one
    address, and how long a request's headers and body may take to arrive. Past a cap a
    connection is closed as it is accepted; a slow request is cut off. Without them, an
    unpaired client holding 1,100 half-sent requests took the engine's file descriptors
    (the owner's loopback API with them: it shares the process)."""

    def __init__(self, total: int, per_address: int, headers_s: float, body_s: float):
        self.total, self.per_address = total, per_address
        self.headers_s, self.body_s = headers_s, body_s
        self.open: Counter[str] = Counter()
        self.refused = self.cut_off = 0

    def admit(self, address: str) -> bool:
        if sum(self.open.values()) >= self.total or self.open[address] >= self.per_address:
            self.refused += 1
            return False
        self.open[address] += 1
        return True

    def leave(self, address: str) -> None:
        self.open[address] -= 1
        if not self.open[address]:
            del self.open[address]

    def status(self) -> dict:
        return {"connections": sum(self.open.values()), "cap": self.total,
                "cap_per_address": self.per_address, "refused": self.refused,
                "cut_off": self.cut_off}


def capped(caps: DoorCaps) -> type:
    """uvicorn's HTTP/1.1 protocol held to `caps` (Config(http=...))."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Capped(H11Protocol):
        _address: str | None = None
        _timer = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            address = self.client[0] if self.client else ""
            if not caps.admit(address):
                transport.close()
                return
            self._address = address
            self._arm(caps.headers_s)

        def connection_lost(self, exc) -> None:
            if self._timer is not None:
                self._timer.cancel()
            if self._address is not None:
                caps.leave(self._address)
                self._address = None
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm(caps.headers_s)  # the next request on this connection, from now

        def _arm(self, seconds: float, body: bool = False) -> None:
            if self._timer is not None:
                self._timer.cancel()
            self._timing_body = body
            self._timer = self.loop.call_later(seconds, self._late)

        def _late(self) -> None:
            """Headers not all in yet: cut off; a body still coming: its own time."""
            state = self.conn.their_state
            if state is h11.SEND_BODY and not self._timing_body:
                self._arm(caps.body_s, body=True)
            elif state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
                caps.cut_off += 1
                self.transport.close()

    return Capped
