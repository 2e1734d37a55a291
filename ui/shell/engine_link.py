"""The window's engine: started (or found running) by app.supervisor off the UI thread,
waited for until its model is loaded, and watched twice a second. It says in signals what
happened; the window decides what to show."""

from __future__ import annotations

import time

from PySide6.QtCore import QObject, QTimer, Signal

from app.client import EngineClient
from app.supervisor import EngineSupervisor

from ..tasks import Task, start_task

LOAD_WAIT_S = 120


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
            return death, (client.health().get("batching") if client and not death else None)

        start_task(check, on_done=self._on_checked,
                   on_error=lambda _e: setattr(self, "_checking", False), owner=self)

    def _on_checked(self, result: tuple[str | None, dict | None]) -> None:
        self._checking = False
        death, batching = result
        if batching:
            self.batching.emit(batching)
        if death and self.client is not None:
            self.last_death = death
            self.died.emit(death)
            self.start()

    def stop(self) -> None:
        self.watchdog.stop()
        self.supervisor.stop()
