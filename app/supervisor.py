"""Keeps an engine available to the desktop app.

It attaches to this user's running engine, or starts its own `homerack serve` child;
`check()` tells whether that engine has died and why, in words for people; `start()`
again brings up a new one. Blocking calls: the app runs them off its UI thread.
"""

from __future__ import annotations

import signal
from pathlib import Path

from engine.catalog.models import DEFAULT_MODEL  # the window starts with the starter model

from .engine_proc import EngineAddress, EngineProcess, answers, find_running

__all__ = ["DEFAULT_MODEL", "EngineSupervisor"]


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        if name == "SIGKILL":
            return "the engine was killed (SIGKILL, possibly by the out-of-memory killer)"
        if name in ("SIGSEGV", "SIGABRT", "SIGBUS"):
            return f"the engine crashed ({name})"
        return f"the engine was stopped ({name})"
    return f"the engine exited with status {returncode}"


class EngineSupervisor:
    def __init__(self, engine_file: Path, serve_args: list[str] = ()):
        self.engine_file = engine_file
        self.serve_args = list(serve_args)
        self.process: EngineProcess | None = None
        self.address: EngineAddress | None = None

    def start(self, timeout: float = 120.0) -> EngineAddress:
        self.address = find_running(self.engine_file)
        if self.address is None:
            self.process = EngineProcess(self.serve_args)
            self.address = self.process.wait_ready(timeout)
        return self.address

    @property
    def owned(self) -> bool:
        return self.process is not None

    def check(self) -> str | None:
        """None while the engine is alive; otherwise what happened to it."""
        if self.process is not None:
            code = self.process.process.poll()
            return None if code is None else describe_exit(code)
        if self.address is not None and not answers(self.address):
            return f"the engine at {self.address.url} stopped answering"
        return None

    def pid(self) -> int | None:
        return self.address.pid if self.address else None

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
