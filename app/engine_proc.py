"""Finding, starting and stopping this user's engine process.

A running engine records its address, token and pid in a user-only runtime file; clients
(the CLI, the desktop app) use it when it answers, or start their own engine.
"""

from __future__ import annotations

import json
import subprocess
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from engine.files import read_json, write_atomic
from engine.spawn import child_env, listens, module_command

LISTENING = "listening on "


@dataclass(frozen=True)
class EngineAddress:
    url: str
    token: str
    pid: int


def write_engine_file(path: Path, address: EngineAddress) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, json.dumps(asdict(address)))  # 0600, a temporary of its own


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


def find_running(engine_file: Path) -> EngineAddress | None:
    """This user's engine, when its file names a live engine that answers to its token.
    A stale file (the engine died, its port taken since by another program) must not have
    the token sent there: the process it names must listen on its port (where the system
    will not list that process's sockets, macOS for some, its being alive must do)."""
    address = read_engine_file(engine_file)
    return address if address and listens(address.pid, urlsplit(address.url).port,
                                          denied=True) and answers(address) else None


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
