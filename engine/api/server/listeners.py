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
    address, how long a request's headers and body may take to arrive, and how long an
    answer may wait for a client that does not read it (`unread_s`). Past a cap a
    connection is closed as it is accepted; a slow request, or a client that stopped
    reading, is cut off. Without them, an unpaired client holding 1,100 half-sent
    requests took the engine's file descriptors (the owner's loopback API with them: it
    shares the process), and 32 connections of pipelined requests never read were held
    for ever."""

    def __init__(self, total: int, per_address: int, headers_s: float, body_s: float,
                 unread_s: float = 30.0):
        self.total, self.per_address = total, per_address
        self.headers_s, self.body_s, self.unread_s = headers_s, body_s, unread_s
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
    """uvicorn's HTTP/1.1 protocol held to `caps` (Config(http=...)). Its slot is given
    back on every way a connection ends: lost, cut off, or handed to another protocol
    (a websocket upgrade, which the listener does not serve: Config(ws="none"); uvicorn
    never tells the first protocol the connection is lost then)."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Capped(H11Protocol):
        _address: str | None = None
        _timer = None
        _unread = None  # armed while the client does not read what was written

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            address = self.client[0] if self.client else ""
            if not caps.admit(address):
                transport.close()
                return
            self._address = address
            self._arm(caps.headers_s)

        def connection_lost(self, exc) -> None:
            self._leave()
            super().connection_lost(exc)

        def handle_websocket_upgrade(self, event) -> None:
            self._leave()
            super().handle_websocket_upgrade(event)

        def _leave(self) -> None:
            for timer in (self._timer, self._unread):
                if timer is not None:
                    timer.cancel()
            self._timer = self._unread = None
            if self._address is not None:
                caps.leave(self._address)
                self._address = None

        def pause_writing(self) -> None:
            """The client is not reading: it has `unread_s` to start again."""
            super().pause_writing()
            if self._unread is None:
                self._unread = self.loop.call_later(caps.unread_s, self._not_read)

        def resume_writing(self) -> None:
            super().resume_writing()
            if self._unread is not None:
                self._unread.cancel()
                self._unread = None

        def _not_read(self) -> None:
            self._unread = None
            caps.cut_off += 1
            self.transport.abort()  # close() would wait to send what it never reads

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
