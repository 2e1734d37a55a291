"""The Cluster page's work: sharing this machine, pairing, using the paired workers (as
pipeline stages, as replicas), and the dashboard polled while the page is open. The panel (cluster_panel.py) shows; this
runs the work off the UI thread and says what happened in signals."""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import QTimer, Signal

from app.supervisor import EngineSupervisor

from .cluster_panel import ClusterPanel
from ..tasks import start_task


class ClusterPage(ClusterPanel):
    notice = Signal(str)
    error = Signal(str)
    restart_engine = Signal()

    def __init__(self, supervisor: EngineSupervisor, data: Path, client, parent=None):
        super().__init__(parent)
        self.supervisor, self.data, self.client = supervisor, data, client  # client(): now
        self.shared = None  # app.workers.SharedMachine while this machine is shared
        self.share_args: list[str] = []  # more `homerack worker` options (tests: loopback)
        self._polling = False
        self.use.setChecked("--workers" in supervisor.serve_args)
        self.replicas.setChecked("--replicas" in supervisor.serve_args)
        self.share_toggled.connect(self._share)
        self.pair_requested.connect(self._pair)
        self.pair_again_requested.connect(self._pair_again)
        self.use_toggled.connect(lambda on: self._use("--workers", "use-workers", on))
        self.replicas_toggled.connect(lambda on: self._use("--replicas", "use-replicas", on))
        self.timer = QTimer(self, interval=1000)
        self.timer.timeout.connect(self._poll)
        self.timer.start()

    def _share(self, on: bool) -> None:
        from app.workers import SharedMachine

        self.pair_again.setEnabled(False)
        if not on:
            shared, self.shared = self.shared, None
            self.show_sharing("Not shared.")
            if shared:
                start_task(lambda _t: shared.stop())
            return
        self.show_sharing("Starting…")
        args = self.share_args + (["--replica"] if self.serve_models.isChecked() else [])
        start_task(lambda _t: SharedMachine(args).wait_ready(),
                   on_done=self._on_shared, on_error=self._on_share_failed, owner=self)

    def _on_shared(self, shared) -> None:
        self.shared = shared
        self.pair_again.setEnabled(True)
        self._show_code(shared.code, "5 minutes")

    def _show_code(self, code: str, open_for: str) -> None:
        self.show_sharing(
            f"Shared at {self.shared.address} · pairing code {code} ({open_for}, one host) · "
            "a paired host and this machine trust each other fully: it sends model weights "
            "and conversations' activations here")

    def _pair_again(self) -> None:
        shared = self.shared
        if shared is not None:
            start_task(lambda _t: shared.pair_again(),
                       on_done=lambda opened: self._show_code(
                           opened[0], "until " + time.strftime("%H:%M", time.localtime(opened[1]))),
                       on_error=lambda e: self.error.emit(str(e)), owner=self)

    def _on_share_failed(self, error) -> None:
        self.share.setChecked(False)
        self.error.emit(f"This machine could not be shared: {error}")

    def _pair(self, address: str, code: str) -> None:
        from app.workers import pair_worker

        if not address or not code:
            self.error.emit("Pairing needs the worker's address and the code it shows.")
            return
        start_task(lambda _t: pair_worker(address, code),
                   on_done=lambda paired: self.notice.emit(
                       f"Paired with worker {paired[0].name} at {paired[0].address}; "
                       f"confirmation {paired[1]}: the worker shows the same digits. Turn on "
                       "“Use paired workers” to give it layers."),
                   on_error=lambda e: self.error.emit(f"Pairing failed: {e}"), owner=self)

    def _use(self, option: str, flag_name: str, on: bool) -> None:
        """Restart the engine with `option auto` (paired workers as stages, or as
        replicas), or without; a flag file keeps the choice for the next start."""
        args = self.supervisor.serve_args
        if option in args:
            at = args.index(option)
            args = args[:at] + args[at + 2:]
        self.supervisor.serve_args = args + ([option, "auto"] if on else [])
        flag = self.data / "cluster" / flag_name
        flag.parent.mkdir(parents=True, exist_ok=True)
        flag.touch() if on else flag.unlink(missing_ok=True)
        if not self.supervisor.owned:
            self.notice.emit("The engine was started outside the app: the change applies "
                             "the next time the app starts it.")
            return
        self.supervisor.stop()
        self.restart_engine.emit()

    def _poll(self) -> None:
        client = self.client()
        if self._polling or not client or not self.isVisible():
            return
        self._polling = True

        def done(view) -> None:
            self._polling = False
            self.show_cluster(view)

        start_task(lambda _t: client.cluster(), on_done=done,
                   on_error=lambda _e: setattr(self, "_polling", False), owner=self)

    def close_down(self) -> None:
        self.timer.stop()
        if self.shared:
            self.shared.stop()
