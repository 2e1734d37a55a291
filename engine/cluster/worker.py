"""A machine shared as a pipeline stage: llama.cpp's RPC server in a supervised child
process on 127.0.0.1 (restarted if it dies, on a new random port each time), the TLS
gateway on the LAN port in front of it, and the mDNS announcement. `homerack worker` and
the app's Share switch run this. With `--replica` the machine also serves whole models:
a Homerack engine of its own in another supervised child (ReplicaEngine), which paired
hosts reach through the gateway (mode "api") and send requests to (cluster/replicas.py).

llama.cpp's RPC server authenticates nobody (its own security policy calls it unsafe
beyond a trusted network), so other local users must not reach it: the gateway relays
only to a port the worker's own child listens on (`rpc_owner`), checked before each
session; if that cannot be read, it refuses (fails closed)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import psutil

from ..spawn import child_env, module_command
from ..spawn import listens as pid_listens
from .gateway import Gateway
from .identity import certificate_fingerprint, ensure_identity, server_context, short
from .pairing import Grants, PairingWindow, window_file
from .protocol import versions
from ..machine.bandwidth import memory_bandwidth

RESTART_DELAY_S = 1.0


@dataclass(frozen=True)
class WorkerConfig:
    name: str
    folder: Path               # identity, grants and the pairing window
    cache_dir: Path | None     # llama.cpp's tensor cache
    host: str = "0.0.0.0"      # the gateway's address (the RPC server is always 127.0.0.1)
    port: int = 0
    threads: int = 2
    ram_bytes: int | None = None  # the most memory this machine offers
    advertise: bool = True     # on the gateway's address (every LAN address for 0.0.0.0)
    replica: tuple[str, ...] | None = None  # `homerack serve` options of a replica engine


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listens(process: subprocess.Popen | None, port: int) -> bool:
    """Whether `process` (a child of ours, running) listens on `port` (False when unknown)."""
    return process is not None and process.poll() is None and pid_listens(process.pid, port)


class ReplicaEngine:
    """This machine's own engine for paired hosts (`homerack serve` on 127.0.0.1, with a
    token of its own and no engine file: the user's `homerack chat` keeps finding the
    user's engine), restarted if it dies."""

    def __init__(self, options: tuple[str, ...]):
        import secrets

        self.options = options
        self.token = secrets.token_urlsafe(32)
        self.port: int | None = None
        self.process: subprocess.Popen | None = None

    def owns(self, port: int) -> bool:
        return listens(self.process, port)

    def _start(self) -> subprocess.Popen:
        self.port = free_port()
        args = module_command("app", "serve", "--host", "127.0.0.1", "--port", str(self.port),
                              "--no-engine-file", "--generation-only", *self.options)
        return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env=child_env(HOMERACK_TOKEN=self.token),
                                cwd=Path(__file__).resolve().parents[2])

    async def supervise(self, log: Callable[[str], None]) -> None:
        try:
            while True:
                self.process = self._start()
                code = await asyncio.to_thread(self.process.wait)
                log(f"the replica engine exited ({code}); restarting it")
                await asyncio.sleep(RESTART_DELAY_S)
        finally:
            if self.process and self.process.poll() is None:
                self.process.terminate()


class Worker:
    def __init__(self, config: WorkerConfig):
        from ..llama.probe import probe

        self.config = config
        cert, key = ensure_identity(config.folder, config.name)
        self.context = server_context(cert, key)
        self.fingerprint = certificate_fingerprint(cert)
        self.grants = Grants(config.folder / "grants.json")
        self.window = PairingWindow(window_file(config.folder))
        self.rpc_endpoint = "127.0.0.1:0"  # the server's, once it runs (_start_rpc)
        hardware = probe()
        self.devices = [{"name": d.name, "kind": d.kind, "description": d.description,
                         "total": d.total_bytes} for d in hardware.devices
                        if not d.name.startswith("RPC")]
        self.bandwidth = memory_bandwidth()
        self._free, self._free_at = 0, 0.0
        self.rpc_process: subprocess.Popen | None = None
        self.rpc_restarts = 0
        self.replica = ReplicaEngine(config.replica) if config.replica is not None else None
        self.gateway = Gateway(config.name, self.grants, self.window, self.fingerprint,
                               lambda: self.rpc_endpoint, self.rpc_owner, self.info,
                               replica=self.replica)

    def free_bytes(self) -> int:
        free = psutil.virtual_memory().available
        return min(free, self.config.ram_bytes) if self.config.ram_bytes else free

    def info(self) -> dict:
        """What each heartbeat answer carries (memory read at most once a second, so a
        pong costs next to nothing and the round trip measures the link)."""
        now = time.monotonic()
        if now - self._free_at > 1.0:
            self._free, self._free_at = self.free_bytes(), now
        return {"devices": self.devices, "free_bytes": self._free,
                "bandwidth": self.bandwidth, "serving": self.gateway.stats.serving,
                "rpc_running": self.rpc_process is not None and self.rpc_process.poll() is None,
                "rpc_restarts": self.rpc_restarts, "replica": self.replica is not None}

    def rpc_owner(self, port: int) -> bool:
        """Whether the worker's own RPC server listens on `port` (False when unknown)."""
        return listens(self.rpc_process, port)

    def _start_rpc(self) -> subprocess.Popen:
        self.rpc_endpoint = f"127.0.0.1:{free_port()}"  # a new one at each (re)start
        args = module_command("engine.llama.rpc", self.rpc_endpoint, str(self.config.threads))
        if self.config.cache_dir:
            self.config.cache_dir.mkdir(parents=True, exist_ok=True)
            args.append(str(self.config.cache_dir))
        return subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                cwd=Path(__file__).resolve().parents[2])

    async def _supervise_rpc(self, log: Callable[[str], None]) -> None:
        while True:
            self.rpc_process = self._start_rpc()
            code = await asyncio.to_thread(self.rpc_process.wait)
            self.rpc_restarts += 1
            log(f"llama.cpp's RPC server exited ({code}); restarting it")
            await asyncio.sleep(RESTART_DELAY_S)

    async def run(self, on_ready: Callable[[str], None],
                  log: Callable[[str], None] = print) -> None:
        """Serve until cancelled; on_ready(gateway address)."""
        self.gateway.on_paired = lambda host, comparison: log(
            f"paired with host {host}; confirmation {comparison} (the host shows the same)")
        supervisor = asyncio.create_task(self._supervise_rpc(log))
        replica = asyncio.create_task(self.replica.supervise(log)) if self.replica else None
        server = await self.gateway.serve(self.config.host, self.config.port, self.context)
        port = server.sockets[0].getsockname()[1]
        advertiser = await asyncio.to_thread(self._advertise, port) if self.config.advertise else None
        on_ready(f"{self.config.host}:{port}")
        log(f"certificate fingerprint {short(self.fingerprint)}")
        try:
            while True:  # keep the announced free memory current
                await asyncio.sleep(10)
                if advertiser:
                    await asyncio.to_thread(advertiser.publish, versions(), self._announced(),
                                            self.free_bytes())
        finally:
            supervisor.cancel()
            if replica:
                replica.cancel()
            server.close()
            if self.rpc_process and self.rpc_process.poll() is None:
                self.rpc_process.kill()
            if advertiser:
                await asyncio.to_thread(advertiser.close)

    def _announced(self) -> list[dict]:
        return [{"name": d["name"], "kind": d["kind"], "total": d["total"]} for d in self.devices]

    def _advertise(self, port: int):
        from .discovery import Advertiser

        addresses = _lan_addresses() if self.config.host in ("0.0.0.0", "") else [self.config.host]
        advertiser = Advertiser(self.config.name, port, addresses, addresses)
        advertiser.publish(versions(), self._announced(), self.free_bytes())
        return advertiser


def _lan_addresses() -> list[str]:
    return [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
            if a.family == socket.AF_INET and not a.address.startswith("127.")]
