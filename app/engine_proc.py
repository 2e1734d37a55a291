"""Finding, starting and stopping this user's engine process.

A running engine records its address, token and pid in a user-only runtime file; clients
(the CLI, the desktop app) use it when it answers, or start their own engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from engine.files import read_json
from engine.spawn import child_env, module_command

LISTENING = "listening on "


@dataclass(frozen=True)
class EngineAddress:
    url: str
    token: str
    pid: int


def write_engine_file(path: Path, address: EngineAddress) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(asdict(address), handle)
    os.replace(tmp, path)


_ENGINE_FILE = {"type": "object", "required": ["url", "token", "pid"], "properties": {
    "url": {"type": "string"}, "token": {"type": "string"}, "pid": {"type": "integer"}}}


def read_engine_file(path: Path) -> EngineAddress | None:
    data = read_json(path, _ENGINE_FILE)
    return EngineAddress(data["url"], data["token"], data["pid"]) if data else None


def remove_engine_file(path: Path, pid: int) -> None:
    current = read_engine_file(path)
    if current and current.pid == pid:
        path.unlink(missing_ok=True)


def answers(address: EngineAddress, timeout: float = 2.0) -> bool:
    """True when an engine is there and accepts this token."""
    try:
        reply = httpx.get(f"{address.url}/v1/models", timeout=timeout,
                          headers={"Authorization": f"Bearer {address.token}"})
    except httpx.HTTPError:
        return False
    return reply.status_code == 200


def listens_at(address: EngineAddress) -> bool:
    """Whether the process the file names is alive and listens on the file's port: a
    stale file (the engine died, its port taken since by another program) must not have
    the token sent there. Where the system will not list a process's sockets (macOS for
    some processes), its being alive must do."""
    import psutil

    port = urlsplit(address.url).port
    try:
        process = psutil.Process(address.pid)
        if not process.is_running() or process.status() == psutil.STATUS_ZOMBIE:
            return False
        sockets = process.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return True
    except psutil.Error:
        return False
    return any(s.status == psutil.CONN_LISTEN and s.laddr and s.laddr[1] == port
               for s in sockets)


def find_running(engine_file: Path) -> EngineAddress | None:
    """This user's engine, when its file names a live engine that answers to its token."""
    address = read_engine_file(engine_file)
    return address if address and listens_at(address) and answers(address) else None


class EngineProcess:
    """A `homerack serve` child process, started with a fresh token."""

    def __init__(self, args: list[str] = (), env: dict | None = None):
        import secrets

        self.token = secrets.token_urlsafe(32)
        self.process = subprocess.Popen(
            module_command("app", "serve", "--port", "0", *args),
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            env=child_env(env, HOMERACK_TOKEN=self.token, PYTHONUNBUFFERED="1"))
        self.output: list[str] = []

    def wait_ready(self, timeout: float = 120.0) -> EngineAddress:
        """Read the child's output until it says where it listens."""
        result: dict = {}

        def read():
            for line in self.process.stdout:
                self.output.append(line.rstrip())
                if line.startswith(LISTENING):
                    result["url"] = line[len(LISTENING):].strip()
                    break

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout)
        if "url" not in result:
            self.stop()
            tail = "\n".join(self.output[-20:])
            raise RuntimeError(f"the engine did not start:\n{tail}")
        threading.Thread(target=self._drain, daemon=True).start()
        return EngineAddress(result["url"], self.token, self.process.pid)

    def _drain(self) -> None:
        for line in self.process.stdout:
            self.output.append(line.rstrip())

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
