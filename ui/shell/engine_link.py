"""The window's engine: started (or found running) by app.supervisor off the UI thread,
waited for until its model is loaded, and watched twice a second. It says in signals what
happened; the window decides what to show. One thing it does itself: when the packaged
app's engine has fetched NVIDIA's CUDA runtime (engine/llama/cuda_runtime.py), it
restarts its own engine once idle, so the model loads on CUDA."""

from __future__ import annotations

import time

from PySide6.QtCore import QObject, QTimer, Signal

from app.client import EngineClient
from app.supervisor import EngineSupervisor

from ..tasks import Task, start_task

LOAD_WAIT_S = 120


def describe_gpu_runtime(status: dict) -> str:
    """The CUDA runtime's fetch, for the status bar."""
    total = status["total_bytes"] / 1e6
    if status["state"] == "fetching":
        return (f"Fetching NVIDIA's CUDA {status['cuda']} runtime for the GPU: "
                f"{status['done_bytes'] / 1e6:,.0f} of {total:,.0f} MB")
    if status["state"] == "failed":
        return f"NVIDIA's CUDA runtime could not be fetched: {status['error']}"
    return "NVIDIA's CUDA runtime is here: the engine restarts on it when idle"


def restart_for_cuda(health: dict, owned: bool) -> bool:
    """The runtime is fetched, nothing is running, and the engine is the app's own."""
    fetched = (health.get("gpu_runtime") or {}).get("state") == "ready"
    return fetched and owned and not (health.get("batching") or {}).get("active")


def _wait_for_model(task: Task, client: EngineClient) -> dict:
    """Poll until the engine has its model loaded (it loads at start)."""
    deadline = time.monotonic() + LOAD_WAIT_S
    while time.monotonic() < deadline and not task.cancelled.is_set():
        health = client.health()
        if health.get("loading"):  # the weights being read: how far
            task.report(health["loading"]["progress"])
        if health.get("model") and not health.get("busy"):
            return {"health": health, "models": client.models(), "hardware": client.hardware()}
        time.sleep(0.2)
    raise TimeoutError("the model did not finish loading within two minutes")


class EngineLink(QObject):
    ready = Signal(object, dict)  # the client; health, models and hardware
    failed = Signal(object)  # it could not start
    died = Signal(str)  # why it died (it is being restarted)
    batching = Signal(dict)  # what the engine does now
    progress = Signal(str)  # what it is doing, for the status bar
    gpu_runtime = Signal(dict)  # NVIDIA's CUDA runtime, being fetched or fetched

    def __init__(self, supervisor: EngineSupervisor, parent=None):
        super().__init__(parent)
        self.supervisor = supervisor
        self.client: EngineClient | None = None
        self.last_death: str | None = None  # until the restarted engine is ready
        self._checking = False
        self.watchdog = QTimer(self, interval=500)
        self.watchdog.timeout.connect(self._check)

    def start(self) -> None:
        self.client = None
        self.watchdog.stop()
        self.progress.emit("Starting the engine…")
        start_task(lambda _task: self.supervisor.start(), on_done=self._on_started,
                   on_error=self.failed.emit, owner=self)

    def _on_started(self, address) -> None:
        client = EngineClient(address)
        self.progress.emit("Loading the model…")
        start_task(_wait_for_model, client, on_done=lambda r: self._on_ready(client, r),
                   on_progress=lambda done: self.progress.emit(f"Loading the model… {done:.0%}"),
                   on_error=self.failed.emit, owner=self)

    def _on_ready(self, client: EngineClient, result: dict) -> None:
        self.client = client
        self.watchdog.start()
        self.ready.emit(client, result)
        self.last_death = None

    def _check(self) -> None:
        if self._checking:
            return
        self._checking = True
        client = self.client

        def check(_task) -> tuple[str | None, dict | None]:
            death = self.supervisor.check()
            return death, (client.health() if client and not death else None)

        start_task(check, on_done=self._on_checked,
                   on_error=lambda _e: setattr(self, "_checking", False), owner=self)

    def _on_checked(self, result: tuple[str | None, dict | None]) -> None:
        self._checking = False
        death, health = result
        if health and health.get("batching"):
            self.batching.emit(health["batching"])
        if health and health.get("gpu_runtime"):
            self.gpu_runtime.emit(health["gpu_runtime"])
            if restart_for_cuda(health, self.supervisor.owned):
                self.restart()
        if death and self.client is not None:
            self.last_death = death
            self.died.emit(death)
            self.start()

    def restart(self) -> None:
        """Stops the app's own engine and starts it again (its model loads again)."""
        self.client = None
        self.watchdog.stop()
        start_task(lambda _task: self.supervisor.stop(), on_done=lambda _r: self.start(),
                   on_error=self.failed.emit, owner=self)

    def stop(self) -> None:
        self.watchdog.stop()
        self.supervisor.stop()
