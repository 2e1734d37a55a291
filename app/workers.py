"""What the app's UI process does for the cluster without loading llama.cpp: pairing
with a worker, and lending this machine as one through a `homerack worker` child process."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time

from engine.spawn import child_env, module_command

from .paths import paths


def pair_worker(address: str, code: str, replace: bool = False):
    """Pair with the worker at `address` and remember it: (the pairing, the digits both
    sides show). Raises Refused/ConnectionError, or PairingConflict when another worker
    of that name is paired elsewhere and not `replace`."""
    from engine.cluster.link import pair
    from engine.cluster.pairing import Pairings

    store = Pairings(paths().pairings)
    pairing, comparison = asyncio.run(pair(address, code, socket.gethostname()))
    store.add(pairing, replace)
    return pairing, comparison


class SharedMachine:
    """This machine shared from the app: a `homerack worker` child, its address and code."""

    def __init__(self, args: list[str] = ()):
        self.process = subprocess.Popen(module_command("app", "worker", *args),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, env=child_env())
        self.address = self.code = None

    def wait_ready(self, timeout: float = 30.0) -> "SharedMachine":
        """Blocks until the worker says where it listens and its pairing code."""
        deadline = time.monotonic() + timeout
        lines = []
        while self.code is None and time.monotonic() < deadline:
            line = self.process.stdout.readline()
            if not line:
                raise RuntimeError("the worker did not start:\n" + "".join(lines[-10:]))
            lines.append(line)
            if " listening on " in line:
                self.address = line.rsplit(" ", 1)[1].strip()
            elif line.startswith("pairing code: "):
                self.code = line.split(": ", 1)[1].split()[0]
        threading.Thread(target=self.process.stdout.read, daemon=True).start()  # drain
        return self

    def pair_again(self) -> tuple[str, float]:
        """Open pairing for one more host, as `homerack worker --pair` does: (a new code,
        when it expires). The worker reads it at the next pairing attempt."""
        from engine.cluster.pairing import open_window, window_file

        self.code, expires = open_window(window_file(paths().worker_folder))
        return self.code, expires

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
