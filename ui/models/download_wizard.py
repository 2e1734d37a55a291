"""The model wizard: search the Hub → choose a file (every quant judged by the engine's
planner for this machine, the recommended one highlighted) → download (progress, pause,
resume, cancel) → ready to chat. Or import a .gguf file from disk.

Everything it asks of the engine runs as a task off the UI thread. Closing the wizard
leaves a download running in the engine; the downloads panel keeps showing it.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (QAbstractItemView, QComboBox, QFileDialog, QHBoxLayout,
                               QLineEdit, QListWidget, QListWidgetItem, QProgressBar,
                               QPushButton, QSplitter, QTableWidget, QTableWidgetItem,
                               QVBoxLayout, QWizard, QWizardPage)

from app.local_models import import_model
from app.client import EngineClient

from .downloads_panel import DownloadWatcher, progress_text, size_text
from ..tasks import start_task
from ..markdown import document
from .model_bar import badges
from ..safe_text import Label, SafeBrowser

FIT_COLORS = {"gpu": "#d4edda", "partial": "#fff3cd", "cpu": "#e2ecf8", "no": "#f8d7da",
              "adapter": "#ece4f7"}


def _abilities(capabilities: list[str] | None) -> str:
    """What the model does: its chat template's "thinks" and "tools", and "sees images"
    when the repository holds a projector (downloaded with the model)."""
    caps = list(capabilities or ())
    words = badges([c for c in caps if c != "vision"]).strip(" ·")
    said = f"\nIts chat template says: {words}." if words else ""
    if "vision" in caps:
        said += "\nIt sees images: its vision projector is downloaded with it."
    return said


class SearchPage(QWizardPage):
    def __init__(self, wizard: "ModelWizard"):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Find a model")
        self.setSubTitle("Search GGUF models on the Hugging Face Hub, or import a file.")
        self.query = QLineEdit(placeholderText="e.g. SmolLM2, Qwen2.5 7B, Llama 3.2")
        self.sort = QComboBox()
        self.sort.addItem("Most downloaded", "downloads")
        self.sort.addItem("Recently updated", "recent")
        self.search_button = QPushButton("Search")
        self.results = QListWidget()
        self.status = Label("Type what you are looking for (a family like Qwen or Llama, "
                             "a size like 7B) and press Enter, or import a .gguf file you "
                             "already have.")
        self.status.setWordWrap(True)
        self.import_button = QPushButton("Import a .gguf file…")
        for widget, name in ((self.query, "Search the Hub"), (self.sort, "Sort by"),
                             (self.results, "Models found")):
            widget.setAccessibleName(name)
        self.query.returnPressed.connect(self.search)
        self.search_button.clicked.connect(self.search)
        self.import_button.clicked.connect(self.import_file)
        self.results.currentItemChanged.connect(lambda *_: self.completeChanged.emit())
        self.results.itemActivated.connect(lambda _i: self.wiz.next())
        row = QHBoxLayout()
        row.addWidget(self.query, 1)
        row.addWidget(self.sort)
        row.addWidget(self.search_button)
        layout = QVBoxLayout(self)
        layout.addLayout(row)
        layout.addWidget(self.results, 1)
        layout.addWidget(self.status)
        layout.addWidget(self.import_button, 0, Qt.AlignLeft)

    def search(self) -> None:
        text = self.query.text().strip()
        self.status.setText(f"Searching for “{text}”…")
        self.results.clear()
        client, sort = self.wiz.client, self.sort.currentData()
        start_task(lambda _t: client.hub_search(text, sort), on_done=self.show_results,
                   on_error=lambda e: self.status.setText(str(e)), owner=self)

    def show_results(self, repos: list[dict]) -> None:
        self.status.setText(
            f"{len(repos)} repositories: pick one to see which of its files fit this machine"
            if repos else f"Nothing on the Hub matches “{self.query.text().strip()}”: try a "
            "family name (Qwen, Llama, Gemma) or fewer words.")
        for repo in repos:
            sizes = (f"{size_text(repo['size_min'])}–{size_text(repo['size_max'])}"
                     if repo["size_max"] else "size unknown")
            extra = " · gated (needs a token)" if repo["gated"] else ""
            if repo.get("embedding"):
                extra += " · embedding model (for /v1/embeddings, not chat)"
            if repo.get("adapter"):
                extra += " · LoRA adapter (used over its base model)"
            item = QListWidgetItem(f"{repo['id']}   ·   {sizes} · {repo['downloads']:,} "
                                   f"downloads · {repo['license'] or 'no license'}{extra}")
            item.setData(Qt.UserRole, repo["id"])
            self.results.addItem(item)
        if repos:
            self.results.setCurrentRow(0)
            self.results.setFocus()

    def import_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import a model", "", "GGUF models (*.gguf)")
        if path:
            self.wiz.import_path(path)

    def isComplete(self) -> bool:
        return self.results.currentItem() is not None

    def validatePage(self) -> bool:
        self.wiz.repo = self.results.currentItem().data(Qt.UserRole)
        return True


class FilesPage(QWizardPage):
    def __init__(self, wizard: "ModelWizard"):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Choose a file")
        self.table = QTableWidget(0, 3)
        self.table.setHorizontalHeaderLabels(["Quant", "Size", "On this machine"])
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.itemSelectionChanged.connect(self.completeChanged.emit)
        self.table.itemActivated.connect(lambda _i: self.wiz.next())
        self.card = SafeBrowser()
        self.drafts = Label()
        self.drafts.setWordWrap(True)
        self.status = Label()
        self.status.setWordWrap(True)
        split = QSplitter(Qt.Vertical)
        split.addWidget(self.table)
        split.addWidget(self.card)
        layout = QVBoxLayout(self)
        layout.addWidget(self.status)
        layout.addWidget(split, 1)
        layout.addWidget(self.drafts)
        self.quants: list[dict] = []

    def initializePage(self) -> None:
        repo, client = self.wiz.repo, self.wiz.client
        self.setSubTitle(repo)
        self.table.setRowCount(0)
        self.quants = []
        self.card.setPlainText("")
        self.drafts.setText("")
        self.status.setText("Judging every file for this machine…")
        start_task(lambda _t: client.hub_quants(repo), on_done=self.show_quants,
                   on_error=lambda e: self.status.setText(str(e)), owner=self)
        start_task(lambda _t: client.hub_card(repo), on_done=lambda card: self.card.setHtml(document(card)),
                   on_error=lambda e: self.card.setPlainText(f"No model card: {e}"), owner=self)
        start_task(lambda _t: client.hub_drafts(repo), on_done=self.show_drafts,
                   on_error=lambda _e: None, owner=self)

    def show_quants(self, result: dict) -> None:
        if result["repo"] != self.wiz.repo:
            return
        self.quants = result["quants"]
        self.status.setText(
            "LoRA adapters: each file with the models of yours it fits. ★ is the recommended "
            "file." if result.get("kind") == "adapter" else
            "Green: all on the GPU · yellow: partly · blue: CPU only · red: will not fit. "
            "★ is the recommended file." + _abilities(result.get("capabilities")))
        self.table.setRowCount(len(self.quants))
        for row, q in enumerate(self.quants):
            cells = [("★ " if q["recommended"] else "") + q["quant"], size_text(q["size_bytes"]),
                     already_here(q.get("on_this_machine")) or q["verdict"]]
            for column, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setBackground(QBrush(QColor(FIT_COLORS[q["fit"]])))
                if q["recommended"]:
                    font = item.font()
                    font.setBold(True)
                    item.setFont(font)
                self.table.setItem(row, column, item)
            if q["recommended"]:
                self.table.selectRow(row)
        self.table.setFocus()

    def show_drafts(self, drafts: list[dict]) -> None:
        if drafts:
            self.drafts.setText("Drafts for speculative decoding (same tokenizer, small): "
                                + ", ".join(f"{d['repo']} {d['quant']} ({size_text(d['size_bytes'])})"
                                            for d in drafts))

    def chosen(self) -> dict | None:
        rows = self.table.selectionModel().selectedRows() if self.table.selectionModel() else []
        return self.quants[rows[0].row()] if rows and self.quants else None

    def isComplete(self) -> bool:
        """A file that fits, and is not on this machine already (no second download)."""
        chosen = self.chosen()
        return chosen is not None and chosen["fit"] != "no" and \
            not chosen.get("on_this_machine")

    def validatePage(self) -> bool:
        self.wiz.quant = self.chosen()["quant"]
        return True


def already_here(model: dict | None) -> str:
    """A quant the user has already, where it lies, in words ("" when it is not here)."""
    if not model:
        return ""
    return f"already on this machine ({model['source_label']}): choose {model['id']} " \
        "in the model list"


class DownloadPage(QWizardPage):
    def __init__(self, wizard: "ModelWizard"):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Downloading")
        self.setSubTitle("You can close this window: the download goes on, and shows under "
                         "Downloads.")
        self.bar = QProgressBar()
        self.bar.setRange(0, 1000)
        self.text = Label()
        self.text.setWordWrap(True)
        self.pause_button, self.resume_button, self.cancel_button = (
            QPushButton(t) for t in ("Pause", "Resume", "Cancel download"))
        for button, action in ((self.pause_button, "pause"), (self.resume_button, "resume"),
                               (self.cancel_button, "cancel")):
            button.clicked.connect(lambda _c=False, a=action: self.wiz.control(a))
        row = QHBoxLayout()
        for button in (self.pause_button, self.resume_button, self.cancel_button):
            row.addWidget(button)
        row.addStretch()
        layout = QVBoxLayout(self)
        layout.addWidget(self.bar)
        layout.addWidget(self.text)
        layout.addLayout(row)
        layout.addStretch()
        self.state: dict | None = None

    def initializePage(self) -> None:
        self.state = None
        self.text.setText(f"Starting {self.wiz.repo} {self.wiz.quant}…")
        self.wiz.start_download()

    def show_state(self, state: dict) -> None:
        self.state = state
        self.bar.setValue(int(1000 * state["done_bytes"] / max(state["size_bytes"], 1)))
        self.text.setText(progress_text(state))
        self.pause_button.setEnabled(state["status"] in ("queued", "downloading"))
        self.resume_button.setEnabled(state["status"] in ("paused", "failed"))
        self.cancel_button.setEnabled(state["status"] not in ("done", "cancelled"))
        self.completeChanged.emit()

    def isComplete(self) -> bool:
        return bool(self.state and self.state["status"] == "done")


class ReadyPage(QWizardPage):
    def __init__(self, wizard: "ModelWizard"):
        super().__init__()
        self.wiz = wizard
        self.setTitle("Ready to chat")
        self.label = Label()
        self.label.setWordWrap(True)
        QVBoxLayout(self).addWidget(self.label)

    def initializePage(self) -> None:
        self.label.setText(f"{self.wiz.model_id} is ready. Finish to chat with it.")


class ModelWizard(QWizard):
    model_ready = Signal(str)  # the new model's id, when the user finishes
    failed = Signal(object)

    def __init__(self, client: EngineClient, watcher: DownloadWatcher, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Get a model")
        self.setOption(QWizard.NoBackButtonOnLastPage)
        self.setTitleFormat(Qt.TextFormat.PlainText)  # a page's subtitle is the Hub's repo name
        self.setSubTitleFormat(Qt.TextFormat.PlainText)
        self.client, self.watcher = client, watcher
        self.repo = self.quant = self.model_id = None
        self.download_id: int | None = None
        self.search_page, self.files_page = SearchPage(self), FilesPage(self)
        self.download_page, self.ready_page = DownloadPage(self), ReadyPage(self)
        for page in (self.search_page, self.files_page, self.download_page, self.ready_page):
            self.addPage(page)
        watcher.changed.connect(self._on_downloads)
        self.finished.connect(self._on_finished)
        self.resize(760, 560)

    def start_download(self) -> None:
        start_task(lambda _t: self.client.start_download(self.repo, self.quant),
                   on_done=self._on_started, on_error=self._on_error, owner=self)

    def _on_started(self, state: dict) -> None:
        self.download_id = state["id"]
        self.download_page.show_state(state)
        self.watcher.start()

    def _on_error(self, error) -> None:
        self.download_page.text.setText(str(error))

    def control(self, action: str) -> None:
        if self.download_id is not None:
            start_task(lambda _t: self.client.control_download(self.download_id, action),
                       on_done=self._on_controlled, on_error=self._on_error, owner=self)

    def _on_controlled(self, state: dict) -> None:
        self.download_page.show_state(state)
        self.watcher.start()  # a resumed download is active again: follow it

    def _on_downloads(self, downloads: list[dict]) -> None:
        state = next((d for d in downloads if d["id"] == self.download_id), None)
        if state is None:
            return
        if state["status"] == "done" and self.model_id is None:
            self.model_id = state["files"][0].rsplit("/", 1)[-1].removesuffix(".gguf")
        self.download_page.show_state(state)

    def import_path(self, path: str) -> None:
        start_task(lambda _t: import_model(path), on_done=self._on_imported,
                   on_error=lambda e: self.search_page.status.setText(
                       getattr(e, "message", str(e))), owner=self)

    def _on_imported(self, model: dict) -> None:
        self.model_id = model["id"]
        self.model_ready.emit(model["id"])
        self.accept()

    def _on_finished(self, result: int) -> None:
        if result == QWizard.Accepted and self.model_id and self.currentPage() is self.ready_page:
            self.model_ready.emit(self.model_id)
