"""Listening sockets and the servers beside the main one: bound here (port 0 picks a free
port, and the real address is known before the first request), served by uvicorn on the
main server's event loop."""

from __future__ import annotations

import contextlib
import socket

import uvicorn


def bind(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)  # early clients wait in the backlog until uvicorn accepts
    return sock



class BesideServer(uvicorn.Server):
    """A second server on the main one's event loop: the main one takes the signals."""
    @contextlib.contextmanager
    def capture_signals(self):
        yield
