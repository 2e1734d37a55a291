"""Where models are found besides Homerack's folder: each other app's folder on or off
(with what it holds), folders the user adds, and the choice to open Ollama's API without
the token for apps that cannot send one. The choices are kept by the app
(app.local_models, app.settings); `changed` asks the window to have the engine read them
again. Looking through the folders runs off the UI thread."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QCheckBox, QFileDialog, QHBoxLayout, QPushButton, QVBoxLayout,
                               QWidget)

from app.local_models import other_models, set_folder
from app.settings import OLLAMA_DOOR, OLLAMA_PORT, switch, switched_on

from ..safe_text import Label
from ..tasks import start_task


class SourcesPanel(QWidget):
    changed = Signal()  # the sources or folders changed: the engine should look again
    error = Signal(str)

    def __init__(self, data: Path, parent=None):
        super().__init__(parent)
        self.data = data
        self.rows = QVBoxLayout()
        self.add_folder = QPushButton("Add a folder of models…",
                                      accessibleName="Add a folder of models")
        self.add_folder.clicked.connect(self._pick_folder)
        self.door = QCheckBox("Ollama's API without the token",  # short: it cannot wrap
                              accessibleName="Serve Ollama's API without the token")
        self.door.setChecked(switched_on(data, OLLAMA_DOOR))
        self.door.toggled.connect(lambda on: switch(self.data, OLLAMA_DOOR, on))
        door_note = Label(
            f"On 127.0.0.1:{OLLAMA_PORT}, Ollama's port, for apps that cannot send a token "
            "(Open WebUI, editor plugins…): any program on this computer can then chat with "
            "your models and load or unload them; other computers and web pages of other "
            "sites cannot. It never sees your documents, your tools or your own cached "
            "conversations. Off by default; applies the next time Homerack starts.",
            objectName="muted",
            wordWrap=True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(Label("Models other apps downloaded, used where they are (never "
                               "copied). Hover a line for its folders.", objectName="muted",
                               wordWrap=True))
        layout.addLayout(self.rows)
        layout.addWidget(self.add_folder)
        layout.addWidget(self.door)
        layout.addWidget(door_note)
        self.refresh()

    def refresh(self) -> None:
        """Look through the folders again (off the UI thread) and show what they hold."""
        start_task(lambda _t: other_models().describe(), on_done=self.show_sources,
                   on_error=lambda e: self.error.emit(f"Could not look for models: {e}"),
                   owner=self)

    def show_sources(self, sources: list[dict]) -> None:
        while self.rows.count():
            widget = self.rows.takeAt(0).widget()
            if widget is not None:
                widget.deleteLater()
        for source in sources:
            self.rows.addWidget(self._row(source))

    def _row(self, source: dict) -> QWidget:
        """One source: its switch (or a folder's Remove) and what it holds in words; the
        folders in its tooltip (a long path would widen the page past the drawer)."""
        count = source["models"]
        held = "not read" if not source["enabled"] else \
            f"{count} model{'s' if count != 1 else ''}" if source["present"] \
            else "not on this computer"
        row = QWidget()
        row.setToolTip("\n".join(source["folders"]))
        column = QVBoxLayout(row)
        column.setContentsMargins(0, 0, 0, 0)
        line = QHBoxLayout()
        if source["source"] == "folder":
            line.addWidget(Label(f"{Path(source['folders'][0]).name or source['folders'][0]}"
                                 f": {held}", wordWrap=True), 1)
            remove = QPushButton("Remove", accessibleName=f"Remove {source['folders'][0]}")
            remove.clicked.connect(lambda _c=False, f=source["folders"][0]: self._folder(f, False))
            line.addWidget(remove)
        else:
            box = QCheckBox(source["label"], accessibleName=source["label"])
            box.setChecked(source["enabled"])
            box.toggled.connect(lambda on, s=source["source"]: self._choose(s, on))
            line.addWidget(box)
            line.addWidget(Label(held, objectName="muted"), 1)
        column.addLayout(line)
        for problem in source["problems"]:
            column.addWidget(Label(f"cannot use {problem['name']}: {problem['problem']}",
                                   objectName="muted", wordWrap=True))
        return row

    def _choose(self, source: str, on: bool) -> None:
        start_task(lambda _t: other_models().choose(source, enabled=on),
                   on_done=lambda _c: self._done(), on_error=lambda e: self.error.emit(str(e)),
                   owner=self)

    def _pick_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "A folder of GGUF models")
        if folder:
            self._folder(folder, True)

    def _folder(self, folder: str, add: bool) -> None:
        start_task(lambda _t: set_folder(folder, add), on_done=lambda _f: self._done(),
                   on_error=lambda e: self.error.emit(str(e)), owner=self)

    def _done(self) -> None:
        self.changed.emit()
        self.refresh()
