"""The main window: conversations on the left, the chat in the centre, the model bar
above it, and Memory, Cluster, Devices, Downloads, Tools, Documents and Settings in a
drawer on the right. It holds
the window's state (ui/state.py), gives each page its collaborators, lays out and wires;
each page owns its behaviour, and every error reaches `show_error`."""

from __future__ import annotations

from dataclasses import replace

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (QMainWindow, QProgressBar, QSplitter, QVBoxLayout,
                               QWidget)

from app.client import EngineClient
from app.history import History, SavedConversation
from app.paths import Paths
from app.settings import UiState, load_settings, save_settings
from app.supervisor import EngineSupervisor

from ..chat.chat_page import ChatPage
from ..cluster.cluster_page import ClusterPage
from ..home.devices_page import DevicesPage
from ..models.downloads_panel import DownloadsPanel, DownloadWatcher
from ..models.model_bar import ModelBar
from ..models.model_control import ModelControl, load_notice
from ..models.plan_panel import PlanPanel
from ..settings.settings_page import SettingsPage
from ..settings.tools_panel import ToolsPanel
from ..documents.documents_page import DocumentsPage
from ..state import WindowState
from ..theme import choose_scheme
from .banner import Banner
from .drawer import Drawer
from .engine_link import EngineLink, describe_gpu_runtime
from .menus import build_menus
from .metrics import MetricsBar, describe_batching
from .sidebar import Sidebar
from .transfer import export_dialog, import_dialog


class MainWindow(QMainWindow):
    def __init__(self, paths: Paths, supervisor: EngineSupervisor):
        super().__init__()
        self.paths, self.supervisor = paths, supervisor
        self.history = History(paths.data / "history.sqlite3")
        self.ui_state = load_settings(paths.data / "ui.json", UiState)
        self.state = WindowState(parent=self)
        self.engine = EngineLink(supervisor, self)
        self._build()
        build_menus(self, self.chat, self.sidebar, self.control)
        self._wire()
        self.refresh_conversations()
        self.chat.view.set_zoom(self.ui_state.zoom)
        if self.ui_state.theme != "system":
            choose_scheme(self.ui_state.theme)
        self.engine.start()

    # -- layout -----------------------------------------------------------------------

    def _build(self) -> None:
        client = lambda: self.engine.client  # noqa: E731 (the one the pages ask for)
        self.sidebar = Sidebar()
        self.bar = ModelBar(self.state)
        self.banner = Banner()
        self.chat = ChatPage(self.history, self.state, self.engine, self.new_conversation,
                             self.paths.data)
        self.settings = SettingsPage(self.paths.data, self.state)
        self.plan_panel = PlanPanel()
        self.downloads_panel = DownloadsPanel()
        self.cluster = ClusterPage(self.supervisor, self.paths.data, client)
        self.tools = ToolsPanel(self.paths, self.engine)
        self.devices = DevicesPage(self.paths.data, client, self.supervisor)
        self.documents = DocumentsPage(self.engine)
        self.drawer = Drawer()
        for name, page in (("Memory", self.plan_panel), ("Cluster", self.cluster),
                           ("Devices", self.devices),
                           ("Downloads", self.downloads_panel), ("Tools", self.tools),
                           ("Documents", self.documents), ("Settings", self.settings)):
            self.drawer.add_page(name, page)
        centre = QWidget()
        column = QVBoxLayout(centre)
        column.addWidget(self.bar)
        column.addWidget(self.banner)
        column.addWidget(self.chat, 1)
        splitter = QSplitter(childrenCollapsible=False)
        for widget, stretch in ((self.sidebar, 0), (centre, 1), (self.drawer, 0)):
            splitter.addWidget(widget)
            splitter.setStretchFactor(splitter.count() - 1, stretch)
        centre.setMinimumWidth(480)  # the chat is never squeezed
        self.sidebar.setMinimumWidth(180)
        splitter.setSizes([240, 760, 380])
        self.setCentralWidget(splitter)
        self.metrics = MetricsBar()
        self.progress = QProgressBar(maximumWidth=140, textVisible=False)
        self.progress.setRange(0, 0)
        self.statusBar().addPermanentWidget(self.metrics)
        self.statusBar().addPermanentWidget(self.progress)
        self.watcher = DownloadWatcher(client, self)
        self.control = ModelControl(self.state, client, self.history, self.new_conversation,
                                    self.bar, self.plan_panel, self.watcher)
        self.setWindowTitle("Homerack")
        self.resize(1280, 800)

    def _wire(self) -> None:
        self.sidebar.new_requested.connect(self.new_conversation)
        self.sidebar.selected.connect(self.open_conversation)
        self.sidebar.renamed.connect(self._rename)
        self.sidebar.delete_requested.connect(self.delete_conversation)
        self.sidebar.search_changed.connect(lambda _t: self.refresh_conversations())
        self.bar.chosen.connect(self.control.choose)
        self.bar.adapters_chosen.connect(self.control.choose_adapters)
        self.bar.reasoning_chosen.connect(lambda effort: self.state.update(reasoning=effort))
        self.sidebar.page_toggled.connect(self.toggle_page)
        self.bar.get_models.connect(self.control.open_wizard)
        self.bar.auto_route.toggled.connect(self._on_auto_route)
        self.drawer.changed.connect(self._on_page)
        self.chat.error.connect(self.show_error)
        self.chat.changed.connect(self._on_chat_changed)
        self.chat.finished.connect(lambda done: self.metrics.show_usage(done.usage, done.n_ctx))
        self.chat.finished.connect(lambda done: self.control.after_reply(done.model))
        self.chat.copied.connect(lambda what: self.statusBar().showMessage(what, 2000))
        self.settings.system_prompt_changed.connect(self._on_system_prompt)
        self.settings.routing_chosen.connect(lambda _pair: self.control.apply_routing())
        self.settings.sources.changed.connect(self.control.sources_changed)
        self.settings.sources.error.connect(self.show_error)
        self.plan_panel.preview_requested.connect(self.control.preview_plan)
        self.plan_panel.load_requested.connect(self.control.load)
        self.downloads_panel.action_requested.connect(self.control.control_download)
        self._wire_models()
        self.watcher.changed.connect(self.downloads_panel.show_downloads)
        self.watcher.finished.connect(self.control.on_download_finished)
        self.cluster.notice.connect(self.show_notice)
        self.cluster.error.connect(self.show_error)
        self.devices.notice.connect(self.show_notice)
        self.devices.error.connect(self.show_error)
        self.tools.notice.connect(self.show_notice)
        self.tools.error.connect(self.show_error)
        self.documents.error.connect(self.show_error)
        self.documents.changed.connect(self.chat.documents.offer)
        self.cluster.restart_engine.connect(self.engine.start)
        self.engine.progress.connect(self._on_engine_progress)
        self.engine.ready.connect(self._on_engine_ready)
        self.engine.failed.connect(self._on_engine_failed)
        self.engine.died.connect(self._on_engine_died)
        self.engine.batching.connect(lambda b: self.metrics.set("batch", describe_batching(b)))
        self.engine.gpu_runtime.connect(
            lambda status: self.statusBar().showMessage(describe_gpu_runtime(status), 2000))

    def _wire_models(self) -> None:
        control, bar = self.control, self.statusBar()
        control.error.connect(self.show_error)
        control.notice.connect(self.show_notice)
        control.status.connect(lambda text, ms: bar.showMessage(text, ms) if text
                               else bar.clearMessage())
        control.busy.connect(self.progress.setVisible)
        control.open_page.connect(self.drawer.open_page)
        control.device.connect(lambda text: self.metrics.set("device", text))
        control.routing_note.connect(self.settings.route_state.setText)
        control.routing_failed.connect(self.settings.routing_failed)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        QTimer.singleShot(0, self.chat.composer.setFocus)  # typing goes to the message

    # -- the pages ---------------------------------------------------------------------

    def toggle_page(self, page: str) -> None:
        self.drawer.toggle(page)

    def _on_page(self, page: str) -> None:
        self.sidebar.show_page(page)
        self.watcher.watching = page == "Downloads"
        if page == "Downloads":
            self.watcher.start()
        if page == "Tools":
            self.tools.refresh()
        if page == "Memory" and self.state.now.model != self.plan_panel.model:
            self.plan_panel.show_model(self.state.now.model)

    def escape(self) -> None:
        """Esc: close the open page, else stop the reply."""
        if self.drawer.page:
            self.drawer.close_page()
            self.chat.composer.setFocus()
        else:
            self.chat.stop()

    def zoom(self, step: int | None) -> None:
        self.chat.view.set_zoom(0 if step is None else self.chat.view.zoom + step)
        self._keep(zoom=self.chat.view.zoom)

    def set_theme(self, scheme: str) -> None:
        choose_scheme(scheme)
        self._keep(theme=scheme)

    def _keep(self, **changes) -> None:
        self.ui_state = replace(self.ui_state, **changes)
        save_settings(self.paths.data / "ui.json", self.ui_state)

    # -- errors and notices: the one place they are shown -----------------------------

    def show_error(self, error, action: str | None = None, callback=None) -> None:
        self.banner.show_message(str(error), True, action, callback)

    def show_notice(self, text: str, action: str | None = None, callback=None) -> None:
        self.banner.show_message(text, False, action, callback)

    # -- the engine -----------------------------------------------------------------------

    def _on_engine_progress(self, text: str) -> None:
        self.progress.show()
        self.statusBar().showMessage(text)
        self.bar.state.setText(text)
        self.chat.update_buttons()

    def _on_engine_ready(self, _client: EngineClient, result: dict) -> None:
        self.progress.hide()
        self.statusBar().showMessage("Ready", 3000)
        notices = [load_notice(result["health"])]
        if self.engine.last_death:
            notices.insert(0, f"The engine was restarted ({self.engine.last_death}). "
                              "Every completed message was kept.")
        if any(notices):
            self.show_notice(" ".join(n for n in notices if n))
        self.chat.welcome.show_machine(result.get("hardware") or {})
        self.control.fill(result["models"], result["health"])
        if self.state.now.routing.on:
            self.control.apply_routing()
        self.watcher.start()  # downloads an earlier engine began carry on: show them
        self.chat.update_buttons()
        self.chat.tools.count()
        self.documents.refresh()  # the chat's Documents menu learns the collections

    def _on_engine_failed(self, error) -> None:
        self.progress.hide()
        self.statusBar().clearMessage()
        self.show_error(f"The engine could not start: {error}", "Retry", self.engine.start)

    def _on_engine_died(self, death: str) -> None:
        for reply in self.chat.sessions.running():
            reply.task.cancel()
        self.show_error(f"{death[0].upper()}{death[1:]}. Restarting it; "
                        "your conversations are safe.")

    # -- conversations ---------------------------------------------------------------

    def refresh_conversations(self) -> None:
        found = self.history.conversations(self.sidebar.search.text().strip())
        current = self.state.now.conversation
        self.sidebar.show_conversations(found, current and current.id)

    def new_conversation(self) -> SavedConversation:
        conversation = self.history.create(model=self.state.now.model)
        if self.state.now.routed:  # as the last one was
            self.history.update(conversation.id, routed=True)
        self._show(self.history.get(conversation.id))
        self.chat.composer.setFocus()
        return self.state.now.conversation

    def open_conversation(self, conversation_id: int) -> None:
        self._show(self.history.get(conversation_id))

    def _show(self, conversation: SavedConversation | None) -> None:
        """Open `conversation` (None: none), with the model it was last held with."""
        if conversation is not None and self.state.now.entry(conversation.model):
            self.state.update(model=conversation.model)
        self.chat.show_conversation(conversation)
        self.refresh_conversations()

    def _is_open(self, conversation_id: int) -> bool:
        current = self.state.now.conversation
        return bool(current and current.id == conversation_id)

    def _reread(self, conversation_id: int) -> None:
        """The open conversation changed in the history: the state takes it again."""
        if self._is_open(conversation_id):
            self.state.update(conversation=self.history.get(conversation_id))

    def _on_chat_changed(self) -> None:
        current = self.state.now.conversation
        title = current.title if current else ""
        self.setWindowTitle(f"{title} — Homerack" if title else "Homerack")
        if self.sidebar.titles()[:1] != [title] and title:
            self.refresh_conversations()  # a new title, or it moved to the top

    def _rename(self, conversation_id: int, title: str) -> None:
        self.history.update(conversation_id, title=title)
        if self._is_open(conversation_id):
            self._reread(conversation_id)
            self._on_chat_changed()
        self.refresh_conversations()

    def delete_conversation(self, conversation_id: int | None = None) -> None:
        current = self.state.now.conversation
        chosen = conversation_id or (current and current.id)
        if not chosen or self.chat.sessions.reply(chosen):
            return
        title = self.history.get(chosen).title
        self.history.delete(chosen)
        if self._is_open(chosen):
            self._show(None)
        self.refresh_conversations()
        self.show_notice(f"Deleted “{title}”.", "Undo", lambda: self._undelete(chosen))

    def export_conversations(self, everything: bool) -> None:
        said = export_dialog(self, self.history, self.state.now.conversation, everything)
        if said.startswith("Exported"):
            self.statusBar().showMessage(said, 5000)
        elif said:
            self.show_notice(said)

    def import_conversations(self) -> None:
        said, added = import_dialog(self, self.history)
        if added:
            self.refresh_conversations()
            self.show_notice(said)
        elif said:
            self.show_error(said)

    def _undelete(self, conversation_id: int) -> None:
        self.history.restore(conversation_id)
        self._show(self.history.get(conversation_id))

    def _on_auto_route(self, on: bool) -> None:
        if current := self.state.now.conversation:
            self.history.update(current.id, routed=on)
            self._reread(current.id)

    def _on_system_prompt(self, text: str) -> None:
        if current := self.state.now.conversation:
            self.history.update(current.id, system_prompt=text)
            self._reread(current.id)

    def closeEvent(self, event) -> None:
        self.cluster.close_down()
        for reply in self.chat.sessions.running():
            reply.task.cancel()
        self.engine.stop()
        self.history.close()
        super().closeEvent(event)
