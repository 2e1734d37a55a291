"""The Documents page: each collection with its state (indexing: files done of total and
time left; ready: files, passages), the files that could not be read with why, and *Add
a folder…*. The engine indexes in its background; the page reads its progress every
second while it is open, off the UI thread."""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (QFileDialog, QInputDialog, QPushButton, QVBoxLayout, QWidget)

from ..safe_text import Label
from ..tasks import start_task


class DocumentsPage(QWidget):
    error = Signal(str)
    changed = Signal(list)  # the collections' names (the chat's Documents menu offers them)

    def __init__(self, engine, parent=None):
        super().__init__(parent)
        self.engine = engine
        self.rows = QVBoxLayout()
        self.add_button = QPushButton("Add a folder…", accessibleName="Add a folder of documents")
        self.add_button.clicked.connect(self._choose)
        self.timer = QTimer(self, interval=1000)
        self.timer.timeout.connect(self.refresh)
        self._reading = False
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(Label(
            "Folders of your documents (text, Markdown, code, HTML, PDF, Word), indexed on "
            "this machine. Turn a collection on for a chat with the composer's Documents "
            "button: answers then cite the file and page they come from.",
            objectName="muted", wordWrap=True))
        layout.addLayout(self.rows)
        layout.addWidget(self.add_button)
        layout.addStretch(1)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        self.refresh()
        self.timer.start()

    def hideEvent(self, event) -> None:
        super().hideEvent(event)
        self.timer.stop()

    def refresh(self) -> None:
        client = self.engine.client
        if client is None or self._reading:
            return
        self._reading = True
        start_task(lambda _t: [client.collection(c["name"])
                               for c in client.collections()["data"]],
                   on_done=self._show, on_error=self._failed, owner=self)

    def _failed(self, error) -> None:
        self._reading = False
        self.timer.stop()
        self.error.emit(f"The documents cannot be read: {error}")

    def _show(self, collections: list[dict]) -> None:
        self._reading = False
        while self.rows.count():
            widget = self.rows.takeAt(0).widget()
            widget.hide()
            widget.deleteLater()
        for c in collections:
            self.rows.addWidget(Label(describe(c), wordWrap=True))
            for failure in c.get("failed", [])[:20]:
                self.rows.addWidget(Label(f"   not read: {failure['path'].rsplit('/', 1)[-1]}"
                                          f" — {failure['error']}", objectName="muted",
                                          wordWrap=True))
        if not collections:
            self.rows.addWidget(Label("No collections yet.", objectName="muted"))
        self.changed.emit([c["name"] for c in collections])

    def _choose(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "A folder of documents")
        if not folder:
            return
        name, ok = QInputDialog.getText(self, "Name the collection", "Name:",
                                        text=folder.rstrip("/").rsplit("/", 1)[-1][:64])
        if ok and name.strip():
            self.add(name.strip(), [folder])

    def add(self, name: str, paths: list[str]) -> None:
        client = self.engine.client
        if client is not None:
            start_task(lambda _t: client.add_collection(name, paths),
                       on_done=lambda _c: self.refresh(),
                       on_error=lambda e: self.error.emit(f"Adding {name} failed: {e}"),
                       owner=self)


def describe(c: dict) -> str:
    """A collection's state in words."""
    if c["state"] in ("indexing", "queued"):
        left = f", about {c['seconds_left']:.0f} s left" if c.get("seconds_left") else ""
        doing = f"indexing: {c.get('files_done', 0):,} of {c.get('files_total', 0):,} files" \
            f"{left}" if c["state"] == "indexing" else "waiting to be indexed"
    else:
        doing = c["state"]
    return (f"{c['name']} — {doing} · {c['files_indexed']:,} files, {c['passages']:,} "
            f"passages" + (f", {c['files_failed']} not readable" if c["files_failed"] else ""))
