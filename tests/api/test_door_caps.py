"""The sharing listener's caps (listeners.py) hold on every way a connection ends, on a
real uvicorn server in this process: a websocket upgrade gives its slot back (uvicorn
hands the socket to another protocol and never tells the first one it is lost: 300
upgrades once held all 256 slots), and a client that pipelines requests and never reads
the answers is cut off (32 such connections were held for ever)."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse

from engine.api.server.listeners import BesideServer, DoorCaps, bind, capped

BIG = "x" * (64 << 10)


def _app() -> FastAPI:
    app = FastAPI()

    @app.get("/big", response_class=PlainTextResponse)
    async def big():
        return BIG

    @app.get("/ws")
    async def not_here():
        return PlainTextResponse("no", status_code=403)

    return app


class Served:
    """A capped listener on 127.0.0.1 in a thread of its own, as the home door runs it."""

    def __init__(self, caps: DoorCaps, ws: str):
        self.caps, self.sock = caps, bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.server = BesideServer(uvicorn.Config(_app(), http=capped(caps), ws=ws,
                                                  log_level="error", lifespan="off"))
        self.thread = threading.Thread(target=lambda: asyncio.run(
            self.server.serve(sockets=[self.sock])), daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def stop(self):
        self.server.should_exit = True
        self.thread.join(5)


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.05)
    return condition()


def _upgrade(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade\r\n"
                     b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        sock.recv(4096)


@pytest.mark.parametrize("ws", ["none", "auto"])
def test_websocket_upgrades_give_their_slots_back(ws):
    """As the door serves (no websockets) and with uvicorn's websocket protocol on."""
    caps = DoorCaps(16, 4, 10.0, 10.0)
    served = Served(caps, ws)
    try:
        for _ in range(40):  # ten times what one address may hold
            _upgrade(served.port)
        assert _wait_for(lambda: not caps.open, 5), caps.status()
        assert caps.admit("127.0.0.9")  # a new device is let in
    finally:
        served.stop()


def test_a_client_that_never_reads_its_answers_is_cut_off():
    caps = DoorCaps(64, 32, 10.0, 10.0, unread_s=1.0)
    served = Served(caps, "none")
    request = b"GET /big HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * 512
    held = []
    try:
        for _ in range(8):
            sock = socket.create_connection(("127.0.0.1", served.port), timeout=5)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.sendall(request)  # 512 pipelined requests, 32 MiB of answers never read
            held.append(sock)
        assert _wait_for(lambda: sum(caps.open.values()) == 8, 5), caps.status()
        assert _wait_for(lambda: not caps.open, 15), caps.status()
        assert caps.cut_off >= 8
    finally:
        for sock in held:
            sock.close()
        served.stop()
