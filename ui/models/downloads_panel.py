"""Downloads that run in the engine, seen from the app: a watcher that polls them off the
UI thread and says when one finishes, and a panel listing them with progress, speed, ETA
and pause / resume / cancel. Closing the wizard that started a download changes nothing:
the engine keeps downloading and this panel keeps showing it."""

from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QObject, QTimer, Signal
from PySide6.QtWidgets import (QGridLayout, QHBoxLayout, QProgressBar, QPushButton,
                               QVBoxLayout, QWidget)

from app.client import EngineClient

from ..tasks import start_task
from ..safe_text import Label

ACTIVE = ("queued", "downloading")


def size_text(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:,.0f} {unit}" if unit in ("B", "KB") else f"{size:,.1f} {unit}"
        size /= 1000
    return ""


def progress_text(d: dict) -> str:
    share = d["done_bytes"] / d["size_bytes"] if d["size_bytes"] else 0
    text = f"{size_text(d['done_bytes'])} of {size_text(d['size_bytes'])} ({share:.0%})"
    if d["status"] == "downloading" and d["speed_bps"]:
        text += f" · {size_text(d['speed_bps'])}/s"
        if d["eta_s"] is not None:
            text += f" · {int(d['eta_s']) // 60}:{int(d['eta_s']) % 60:02d} left"
    elif d["status"] == "failed":
        text += f" · failed: {d['error']}"
    elif d["status"] != "downloading":
        text += f" · {d['status']}"
    return text


class DownloadWatcher(QObject):
    """Polls the engine's downloads while any is active or someone is looking."""
    changed = Signal(list)
    finished = Signal(dict)  # a download that just completed
    failed = Signal(object)

    def __init__(self, client: Callable[[], EngineClient | None], parent=None):
        super().__init__(parent)
        self._client = client
        self._known: dict[int, str] = {}
        self._polling = False
        self.watching = False  # a view is open: poll even when nothing is active
        self.timer = QTimer(self, interval=400)
        self.timer.timeout.connect(self.poll)

    def poll(self) -> None:
        client = self._client()
        if client is None or self._polling:
            return
        self._polling = True
        start_task(lambda _t: client.downloads(), on_done=self._on_list,
                   on_error=self._on_error, owner=self)

    def _on_list(self, downloads: list[dict]) -> None:
        self._polling = False
        for d in downloads:
            if d["status"] == "done" and self._known.get(d["id"]) not in (None, "done"):
                self.finished.emit(d)
            self._known[d["id"]] = d["status"]
        self.changed.emit(downloads)
        if not self.watching and not any(d["status"] in ACTIVE for d in downloads):
            self.timer.stop()

    def _on_error(self, error) -> None:
        self._polling = False
        self.failed.emit(error)

    def start(self) -> None:
        self.timer.start()
        self.poll()


class DownloadsPanel(QWidget):
    action_requested = Signal(int, str)  # download id, "pause" / "resume" / "cancel"

    def __init__(self, parent=None):
        super().__init__(parent)
        self.empty = Label("No downloads. Use “Get models…” to find one on the Hugging Face Hub.")
        self.rows = QGridLayout()
        layout = QVBoxLayout(self)
        layout.addWidget(self.empty)
        layout.addLayout(self.rows)
        self._widgets: dict[int, tuple] = {}

    def show_downloads(self, downloads: list[dict]) -> None:
        self.empty.setVisible(not downloads)
        for d in downloads:
            if d["id"] not in self._widgets:
                self._add_row(d)
            title, bar, text, buttons = self._widgets[d["id"]]
            bar.setRange(0, 1000)
            bar.setValue(int(1000 * d["done_bytes"] / max(d["size_bytes"], 1)))
            text.setText(progress_text(d))
            pause, resume, cancel = buttons
            pause.setVisible(d["status"] in ACTIVE)
            resume.setVisible(d["status"] in ("paused", "failed"))
            cancel.setVisible(d["status"] not in ("done", "cancelled"))

    def _add_row(self, d: dict) -> None:
        row = len(self._widgets)
        title = Label(f"{d['repo']} {d['quant']}")
        title.setStyleSheet("font-weight: 600")
        bar = QProgressBar(textVisible=False, maximumHeight=12)
        text = Label()
        buttons = []
        box = QHBoxLayout()
        for action in ("pause", "resume", "cancel"):
            button = QPushButton(action.capitalize())
            button.clicked.connect(lambda _c=False, a=action: self.action_requested.emit(d["id"], a))
            box.addWidget(button)
            buttons.append(button)
        self.rows.addWidget(title, row * 2, 0)
        self.rows.addWidget(bar, row * 2, 1)
        self.rows.addLayout(box, row * 2, 2)
        self.rows.addWidget(text, row * 2 + 1, 0, 1, 3)
        self._widgets[d["id"]] = (title, bar, text, buttons)
