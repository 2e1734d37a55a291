"""The main window: conversations on the left, the chat on the right, figures below.

All engine calls run as tasks (ui.tasks) off the UI thread. Errors reach one place,
`show_error`, which shows them in the banner above the chat.
"""

from __future__ import annotations

import time

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QIcon, QKeySequence, QShortcut
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout, QFrame, QHBoxLayout,
                               QInputDialog, QLabel, QLineEdit, QListWidget, QListWidgetItem,
                               QMainWindow, QPlainTextEdit, QProgressBar, QPushButton,
                               QSpinBox, QSplitter, QVBoxLayout, QWidget)

from app.client import EngineClient, StreamedReply
from app.history import History, SavedConversation
from app.session import Sessions
from app.paths import Paths
from app.settings import RoutingPair, Sampling, load_settings, save_settings
from app.supervisor import EngineSupervisor

from .chat_view import ChatView
from .composer import Composer
from .markdown import Shown
from .metrics import MetricsBar, describe_batching
from .download_wizard import ModelWizard
from .downloads_panel import DownloadsPanel, DownloadWatcher
from .cluster_panel import ClusterPanel
from .plan_panel import PlanPanel
from .tasks import Task, start_task

STREAM_KEY = "streaming"


def _receive_reply(task: Task, client: EngineClient, messages: list[dict],
                   options: dict) -> StreamedReply:
    reply = StreamedReply()  # the client's record of the stream: finish reason, usage
    for piece in client.stream_chat(messages, reply, should_stop=task.cancelled.is_set, **options):
        task.report(piece)
    return reply


def _wait_for_model(task: Task, client: EngineClient) -> dict:
    """Poll until the engine has its model loaded (it loads at start)."""
    import time

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not task.cancelled.is_set():
        health = client.health()
        if health.get("model") and not health.get("busy"):
            return {"health": health, "models": client.models()}
        time.sleep(0.2)
    raise TimeoutError("the model did not finish loading within two minutes")


def _load_notice(health: dict) -> str:
    """What the engine changed to load the model (memory ran out, a crash before)."""
    notes = health.get("load_notes")
    return "Loaded with a safer plan: " + "; ".join(notes) + "." if notes else ""


class Banner(QFrame):
    """One line above the chat: errors (red) and notices, with an optional action."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("banner")
        layout = QHBoxLayout(self)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.action = QPushButton()
        layout.addWidget(self.label, 1)
        layout.addWidget(self.action)
        self._callback = None
        self.action.clicked.connect(lambda: self._callback and self._callback())
        self.hide()

    def show_message(self, text: str, error: bool, action: str | None = None, callback=None):
        self.setProperty("error", error)
        self.setStyleSheet("#banner { background: %s; border-radius: 4px; }"
                           % ("#f8d7da" if error else "#e2ecf8"))
        self.label.setText(text)
        self._callback = callback
        self.action.setVisible(bool(action))
        self.action.setText(action or "")
        self.show()


class MainWindow(QMainWindow):
    def __init__(self, paths: Paths, supervisor: EngineSupervisor):
        super().__init__()
        self.paths = paths
        self.history = History(paths.data / "history.sqlite3")
        self.sampling = load_settings(paths.data / "settings.json", Sampling)
        self.routing = load_settings(paths.data / "routing.json", RoutingPair)
        self.supervisor = supervisor
        self.client: EngineClient | None = None
        self.conversation: SavedConversation | None = None
        self.sessions = Sessions(self.history)  # replies being generated, by conversation
        self.last_death: str | None = None
        self.loaded_model: str | None = None
        self._checking = False
        self.shared = None  # app.cluster.SharedMachine while this machine is shared
        self.share_args: list[str] = []  # more `homerack worker` options (tests: loopback)
        self._polling_cluster = False
        self.setWindowTitle("Homerack")
        icon = paths_icon()
        if icon:
            self.setWindowIcon(icon)
        self._build()
        self._shortcuts()
        self.refresh_conversations()
        self.watchdog = QTimer(self, interval=500)
        self.watchdog.timeout.connect(self._check_engine)
        self.start_engine()

    # -- layout -----------------------------------------------------------------

    def _build(self) -> None:
        self.search = QLineEdit(placeholderText="Search conversations")
        self.search.textChanged.connect(self.refresh_conversations)
        self.conversation_list = QListWidget()
        self.conversation_list.currentItemChanged.connect(self._on_conversation_selected)
        new, rename, delete = (QPushButton(t) for t in ("New", "Rename", "Delete"))
        new.clicked.connect(self.new_conversation)
        rename.clicked.connect(self.rename_conversation)
        delete.clicked.connect(self.delete_conversation)
        sidebar = QWidget()
        side = QVBoxLayout(sidebar)
        side.addWidget(self.search)
        side.addWidget(self.conversation_list, 1)
        row = QHBoxLayout()
        for button in (new, rename, delete):
            row.addWidget(button)
        side.addLayout(row)

        self.banner = Banner()
        self.model_box = QComboBox()
        self.model_box.setMinimumWidth(240)
        self.model_box.activated.connect(self._on_model_chosen)
        self.settings_button = QPushButton("Settings", checkable=True)
        self.plan_button = QPushButton("Memory", checkable=True)
        self.get_models_button = QPushButton("Get models…")
        self.get_models_button.clicked.connect(self.open_wizard)
        self.downloads_button = QPushButton("Downloads", checkable=True)
        self.cluster_button = QPushButton("Cluster", checkable=True)
        self.auto_route = QCheckBox("Auto-route")
        self.auto_route.setToolTip("Send each reply of this conversation to the small or the "
                                   "large model of the routing pair (Settings)")
        self.auto_route.toggled.connect(self._on_auto_route)
        top = QHBoxLayout()
        top.addWidget(QLabel("Model:"))
        top.addWidget(self.model_box, 1)
        top.addWidget(self.auto_route)
        top.addWidget(self.get_models_button)
        top.addWidget(self.downloads_button)
        top.addWidget(self.plan_button)
        top.addWidget(self.cluster_button)
        top.addWidget(self.settings_button)
        self.settings_panel = self._build_settings()
        self.settings_button.toggled.connect(self.settings_panel.setVisible)
        self.settings_panel.hide()
        self.plan_panel = PlanPanel()
        self.plan_panel.preview_requested.connect(self._preview_plan)
        self.plan_panel.load_requested.connect(self._load_model)
        self.plan_button.toggled.connect(self._toggle_plan)
        self.plan_panel.hide()
        self.downloads_panel = DownloadsPanel()
        self.downloads_panel.action_requested.connect(self._control_download)
        self.downloads_button.toggled.connect(self._toggle_downloads)
        self.downloads_panel.hide()
        self.watcher = DownloadWatcher(lambda: self.client, self)
        self.watcher.changed.connect(self.downloads_panel.show_downloads)
        self.watcher.finished.connect(self._on_download_finished)
        self.wizard: ModelWizard | None = None
        self.cluster_panel = ClusterPanel()
        self.cluster_panel.hide()
        self.cluster_panel.use.setChecked("--workers" in self.supervisor.serve_args)
        self.cluster_button.toggled.connect(self.cluster_panel.setVisible)
        self.cluster_panel.share_toggled.connect(self._share)
        self.cluster_panel.pair_requested.connect(self._pair)
        self.cluster_panel.pair_again_requested.connect(self._pair_again)
        self.cluster_panel.use_toggled.connect(self._use_workers)
        self.cluster_timer = QTimer(self, interval=1000)
        self.cluster_timer.timeout.connect(self._poll_cluster)
        self.cluster_timer.start()

        self.view = ChatView()
        self.view.copied.connect(lambda _t: self.statusBar().showMessage("Copied", 2000))
        self.composer = Composer()
        self.composer.submitted.connect(self.send)
        self.send_button = QPushButton("Send")
        self.send_button.clicked.connect(lambda: self.send(self.composer.toPlainText().strip()))
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.clicked.connect(self.regenerate)
        self.edit_button = QPushButton("Edit last")
        self.edit_button.clicked.connect(self.edit_last)
        buttons = QHBoxLayout()
        for button in (self.edit_button, self.regenerate_button, self.stop_button,
                       self.send_button):
            buttons.addWidget(button)
        buttons.insertStretch(0)

        chat = QWidget()
        main = QVBoxLayout(chat)
        main.addWidget(self.banner)
        main.addLayout(top)
        main.addWidget(self.settings_panel)
        main.addWidget(self.plan_panel)
        main.addWidget(self.downloads_panel)
        main.addWidget(self.cluster_panel)
        main.addWidget(self.view, 1)
        main.addWidget(self.composer)
        main.addLayout(buttons)

        splitter = QSplitter()
        splitter.addWidget(sidebar)
        splitter.addWidget(chat)
        splitter.setSizes([240, 760])
        self.setCentralWidget(splitter)

        self.metrics = MetricsBar()
        self.progress = QProgressBar(maximumWidth=140, textVisible=False)
        self.progress.setRange(0, 0)
        self.statusBar().addPermanentWidget(self.metrics)
        self.statusBar().addPermanentWidget(self.progress)
        self.resize(1040, 720)
        self._update_buttons()

    def _build_settings(self) -> QWidget:
        panel = QWidget()
        form = QFormLayout(panel)
        self.system_prompt = QPlainTextEdit(placeholderText="System prompt for this conversation")
        self.system_prompt.setMaximumHeight(70)
        self.system_prompt.textChanged.connect(self._on_system_prompt)
        self.temperature = QDoubleSpinBox(minimum=0, maximum=2, singleStep=0.1, decimals=2)
        self.top_p = QDoubleSpinBox(minimum=0.05, maximum=1, singleStep=0.05, decimals=2)
        self.max_tokens = QSpinBox(minimum=1, maximum=32768)
        self.seed = QSpinBox(minimum=-1, maximum=2**31 - 1, specialValueText="random")
        self.speculation = QComboBox()
        self._fill_speculation([])
        self.speculation.currentIndexChanged.connect(self._on_sampling)
        self.temperature.setValue(self.sampling.temperature)
        self.top_p.setValue(self.sampling.top_p)
        self.max_tokens.setValue(self.sampling.max_tokens)
        self.seed.setValue(self.sampling.seed)
        for widget in (self.temperature, self.top_p, self.max_tokens, self.seed):
            widget.valueChanged.connect(self._on_sampling)
        form.addRow("System prompt", self.system_prompt)
        form.addRow("Temperature", self.temperature)
        form.addRow("Top-p", self.top_p)
        form.addRow("Max tokens", self.max_tokens)
        form.addRow("Seed", self.seed)
        form.addRow("Speculative decoding", self.speculation)
        self.route_small, self.route_large = QComboBox(), QComboBox()
        self.route_mode = QComboBox()
        for label, value in (("Rules", "rules"), ("Cascade", "cascade")):
            self.route_mode.addItem(label, value)
        self.route_mode.setCurrentIndex(max(self.route_mode.findData(self.routing.mode), 0))
        self.route_apply = QPushButton("Apply")
        self.route_apply.clicked.connect(self._choose_routing)
        self.route_state = QLabel()
        self.route_state.setWordWrap(True)
        pair = QHBoxLayout()
        for label, widget in (("Small", self.route_small), ("Large", self.route_large),
                              ("By", self.route_mode)):
            pair.addWidget(QLabel(label))
            pair.addWidget(widget, 1)
        pair.addWidget(self.route_apply)
        form.addRow("Routing", pair)
        form.addRow("", self.route_state)
        return panel

    def _fill_routing(self, models: list[dict]) -> None:
        for box, chosen in ((self.route_small, self.routing.small),
                            (self.route_large, self.routing.large)):
            box.clear()
            box.addItem("Off", "")
            for model in models:
                box.addItem(model["id"], model["id"])
            box.setCurrentIndex(max(box.findData(chosen), 0))

    def _choose_routing(self) -> None:
        self.routing = RoutingPair(self.route_small.currentData() or "",
                                   self.route_large.currentData() or "",
                                   self.route_mode.currentData())
        save_settings(self.paths.data / "routing.json", self.routing)
        self._apply_routing()

    def _apply_routing(self) -> None:
        """Give the engine the pair (also after it restarts); its plan says whether both
        models stay loaded or each switch swaps them."""
        client, pair = self.client, self.routing
        if client is None:
            return
        self._update_buttons()
        start_task(lambda _t: client.set_routing(pair.small, pair.large, pair.mode),
                   on_done=self._on_routing, on_error=self._on_routing_failed)

    def _on_routing(self, answer: dict) -> None:
        plan = answer.get("plan")
        self.route_state.setText(plan["note"] if plan else "Routing is off.")

    def _on_routing_failed(self, error) -> None:
        self.routing = RoutingPair()
        self.route_state.setText("Routing is off.")
        self._update_buttons()
        self.show_error(f"Routing could not be set: {error}")

    def _on_auto_route(self, on: bool) -> None:
        if self.conversation:
            self.history.update(self.conversation.id, routed=on)
            self.conversation = self.history.get(self.conversation.id)
        self._update_buttons()

    def _fill_speculation(self, models: list[dict]) -> None:
        """Off, prompt lookup, an automatic draft, or any local model as the draft."""
        self.speculation.blockSignals(True)
        self.speculation.clear()
        choices = [("Off", "off"), ("Prompt lookup", "lookup"), ("Draft model: automatic", "draft:auto")]
        choices += [(f"Draft model: {m['id']}", f"draft:{m['id']}") for m in models]
        for label, value in choices:
            self.speculation.addItem(label, value)
        self.speculation.setCurrentIndex(max(self.speculation.findData(self.sampling.speculation), 0))
        self.speculation.blockSignals(False)

    def _shortcuts(self) -> None:
        QShortcut(QKeySequence(Qt.Key_Escape), self, activated=self.stop)
        QShortcut(QKeySequence("Ctrl+N"), self, activated=self.new_conversation)

    def _update_buttons(self) -> None:
        streaming = self._current_reply() is not None
        ready = self.client is not None
        self.send_button.setEnabled(ready and not streaming)
        self.stop_button.setEnabled(streaming)
        has_reply = bool(self.conversation and self.history.messages(self.conversation.id))
        self.regenerate_button.setEnabled(ready and not streaming and has_reply)
        self.edit_button.setEnabled(not streaming and has_reply)
        self.auto_route.setEnabled(self.routing.on)
        routed = bool(self.conversation and self.conversation.routed and self.routing.on)
        self.model_box.setEnabled(not routed)  # "auto" picks the model of each reply

    # -- errors and notices: the one place they are shown -------------------------

    def show_error(self, error, action: str | None = None, callback=None) -> None:
        self.banner.show_message(str(error), True, action, callback)

    def show_notice(self, text: str) -> None:
        self.banner.show_message(text, False)

    # -- the engine ---------------------------------------------------------------

    def start_engine(self) -> None:
        self.client = None
        self.watchdog.stop()
        self.progress.show()
        self.statusBar().showMessage("Starting the engine…")
        start_task(lambda _task: self.supervisor.start(), on_done=self._on_engine_started,
                   on_error=self._on_engine_failed)
        self._update_buttons()

    def _on_engine_started(self, address) -> None:
        client = EngineClient(address)
        self.statusBar().showMessage("Loading the model…")
        start_task(_wait_for_model, client, on_done=lambda r: self._on_model_ready(client, r),
                   on_error=self._on_engine_failed)

    def _on_model_ready(self, client: EngineClient, result: dict) -> None:
        self.client = client
        self.progress.hide()
        self.statusBar().showMessage("Ready", 3000)
        notices = [_load_notice(result["health"])]
        if self.last_death:
            notices.insert(0, f"The engine was restarted ({self.last_death}). "
                              "Every completed message was kept.")
            self.last_death = None
        if any(notices):
            self.show_notice(" ".join(n for n in notices if n))
        self._fill_models(result["models"], result["health"])
        if self.routing.on:
            self._apply_routing()
        self.watcher.start()  # downloads an earlier engine began carry on: show them
        self.watchdog.start()
        self._update_buttons()

    def _on_engine_failed(self, error) -> None:
        self.progress.hide()
        self.statusBar().clearMessage()
        self.show_error(f"The engine could not start: {error}", "Retry", self.start_engine)

    def _fill_models(self, models: list[dict], health: dict) -> None:
        # A refresh keeps what the box shows: two refreshes can finish in either order
        # (the wizard's, which selects the new model, and the downloads watcher's), and
        # one that reset the box undid the other's choice (the wizard test's 30 s wait).
        current = (self.model_box.currentData() or (self.conversation and self.conversation.model)
                   or health.get("model"))
        self.model_box.clear()
        # embedding models cannot chat; "auto" is the conversation's Auto-route box
        models = [m for m in models if m.get("kind") not in ("embedding", "router")]
        for model in models:
            self.model_box.addItem(f"{model['id']}  ({model['size_bytes'] / 2**20:.0f} MiB)",
                                   model["id"])
        index = self.model_box.findData(current)
        self.model_box.setCurrentIndex(max(index, 0))
        self._fill_speculation(models)
        self._fill_routing(models)
        self.loaded_model = health.get("model")
        loaded = next((m for m in models if m["id"] == health.get("model")), None)
        memory = health.get("memory") or {}
        devices = memory.get("devices") or []
        if devices:  # what llama.cpp allocated, against the planner's prediction
            used = sum(d["measured_bytes"] for d in devices) / 2**20
            planned = sum(d["predicted_bytes"] for d in devices) / 2**20
            self.metrics.set("device", f"{health.get('offload', 'CPU')} · {used:.0f} MiB "
                                       f"(planned {planned:.0f})")
        elif loaded:
            self.metrics.set("device", f"{health.get('offload', 'CPU')} · "
                                       f"{loaded['size_bytes'] / 2**20:.0f} MiB weights")
            self.metrics.set("context", f"0 / {health.get('n_ctx')}")

    def _check_engine(self) -> None:
        if self._checking:
            return
        self._checking = True
        client = self.client

        def check(_task) -> tuple[str | None, dict | None]:
            death = self.supervisor.check()
            return death, (client.health().get("batching") if client and not death else None)

        start_task(check, on_done=self._on_engine_checked,
                   on_error=lambda _e: setattr(self, "_checking", False))

    def _on_engine_checked(self, result: tuple[str | None, dict | None]) -> None:
        self._checking = False
        death, batching = result
        if batching:
            self.metrics.set("batch", describe_batching(batching))
        if death and self.client is not None:
            self.last_death = death
            for reply in self.sessions.running():
                reply.task.cancel()
            self.show_error(f"{death[0].upper()}{death[1:]}. Restarting it; "
                            "your conversations are safe.")
            self.start_engine()

    # -- the cluster ----------------------------------------------------------------

    def _share(self, on: bool) -> None:
        from app.sharing import SharedMachine

        self.cluster_panel.pair_again.setEnabled(False)
        if not on:
            shared, self.shared = self.shared, None
            self.cluster_panel.show_sharing("Not shared.")
            if shared:
                start_task(lambda _t: shared.stop())
            return
        self.cluster_panel.show_sharing("Starting…")
        start_task(lambda _t: SharedMachine(self.share_args).wait_ready(),
                   on_done=self._on_shared, on_error=self._on_share_failed)

    def _on_shared(self, shared) -> None:
        self.shared = shared
        self.cluster_panel.pair_again.setEnabled(True)
        self._show_code(shared.code, "5 minutes")

    def _show_code(self, code: str, open_for: str) -> None:
        self.cluster_panel.show_sharing(
            f"Shared at {self.shared.address} · pairing code {code} ({open_for}, one host) · "
            "a paired host and this machine trust each other fully: it sends model weights "
            "and conversations' activations here")

    def _pair_again(self) -> None:
        shared = self.shared
        if shared is not None:
            start_task(lambda _t: shared.pair_again(),
                       on_done=lambda opened: self._show_code(
                           opened[0], "until " + time.strftime("%H:%M", time.localtime(opened[1]))),
                       on_error=self.show_error)

    def _on_share_failed(self, error) -> None:
        self.cluster_panel.share.setChecked(False)
        self.show_error(f"This machine could not be shared: {error}")

    def _pair(self, address: str, code: str) -> None:
        from app.sharing import pair_worker

        if not address or not code:
            self.show_error("Pairing needs the worker's address and the code it shows.")
            return
        start_task(lambda _t: pair_worker(address, code),
                   on_done=lambda paired: self.show_notice(
                       f"Paired with worker {paired[0].name} at {paired[0].address}; "
                       f"confirmation {paired[1]}: the worker shows the same digits. Turn on "
                       "“Use paired workers” to give it layers."),
                   on_error=lambda e: self.show_error(f"Pairing failed: {e}"))

    def _use_workers(self, on: bool) -> None:
        args = [a for a in self.supervisor.serve_args if a not in ("--workers", "auto")]
        self.supervisor.serve_args = args + (["--workers", "auto"] if on else [])
        flag = self.paths.data / "cluster" / "use-workers"
        flag.parent.mkdir(parents=True, exist_ok=True)
        flag.touch() if on else flag.unlink(missing_ok=True)  # the next start keeps it
        if not self.supervisor.owned:
            self.show_notice("The engine was started outside the app: the change applies "
                             "the next time the app starts it.")
            return
        self.supervisor.stop()
        self.start_engine()

    def _poll_cluster(self) -> None:
        if self._polling_cluster or not self.client or not self.cluster_panel.isVisible():
            return
        self._polling_cluster = True
        client = self.client

        def done(view) -> None:
            self._polling_cluster = False
            self.cluster_panel.show_cluster(view)

        start_task(lambda _t: client.cluster(), on_done=done,
                   on_error=lambda _e: setattr(self, "_polling_cluster", False))

    # -- conversations ------------------------------------------------------------

    def refresh_conversations(self) -> None:
        self.conversation_list.blockSignals(True)
        self.conversation_list.clear()
        for conversation in self.history.conversations(self.search.text().strip()):
            item = QListWidgetItem(conversation.title)
            item.setData(Qt.UserRole, conversation.id)
            self.conversation_list.addItem(item)
            if self.conversation and conversation.id == self.conversation.id:
                self.conversation_list.setCurrentItem(item)
        self.conversation_list.blockSignals(False)

    def new_conversation(self) -> SavedConversation:
        self.conversation = self.history.create(model=self.model_box.currentData())
        if self.auto_route.isChecked() and self.routing.on:  # as the last one was
            self.history.update(self.conversation.id, routed=True)
            self.conversation = self.history.get(self.conversation.id)
        self.refresh_conversations()
        self._show_conversation()
        self.composer.setFocus()
        return self.conversation

    def open_conversation(self, conversation_id: int) -> None:
        self.conversation = self.history.get(conversation_id)
        self.system_prompt.blockSignals(True)
        self.system_prompt.setPlainText(self.conversation.system_prompt)
        self.system_prompt.blockSignals(False)
        index = self.model_box.findData(self.conversation.model)
        if index >= 0:
            self.model_box.setCurrentIndex(index)
        self.auto_route.blockSignals(True)
        self.auto_route.setChecked(self.conversation.routed)
        self.auto_route.blockSignals(False)
        self._show_conversation()

    def rename_conversation(self) -> None:
        if not self.conversation:
            return
        title, ok = QInputDialog.getText(self, "Rename", "Title:", text=self.conversation.title)
        if ok and title.strip():
            self.history.update(self.conversation.id, title=title.strip())
            self.conversation = self.history.get(self.conversation.id)
            self.refresh_conversations()

    def delete_conversation(self) -> None:
        if not self.conversation or self._current_reply():
            return
        self.history.delete(self.conversation.id)
        self.conversation = None
        self.refresh_conversations()
        self._show_conversation()

    def _on_conversation_selected(self, item, _previous) -> None:
        if item is not None:
            self.open_conversation(item.data(Qt.UserRole))

    def _on_model_chosen(self, _index: int) -> None:
        model = self.model_box.currentData()
        if self.conversation:
            self.history.update(self.conversation.id, model=model)
        if model and model != self.loaded_model:  # show what loading it will take
            self.plan_button.setChecked(True)
            self.plan_panel.show_model(model)

    # -- getting models: the wizard and the downloads panel ---------------------------

    def open_wizard(self) -> None:
        if not self.client:
            return
        if self.wizard is None:  # one wizard; reopened as it was (a download may be on)
            self.wizard = ModelWizard(self.client, self.watcher, self)
            self.wizard.model_ready.connect(self._on_new_model)
            self.wizard.finished.connect(lambda _r: setattr(self, "wizard", None))
        self.wizard.show()
        self.wizard.raise_()

    def _toggle_downloads(self, shown: bool) -> None:
        self.downloads_panel.setVisible(shown)
        self.watcher.watching = shown
        if shown:
            self.watcher.start()

    def _control_download(self, download_id: int, action: str) -> None:
        if self.client:
            start_task(lambda _t: self.client.control_download(download_id, action),
                       on_done=lambda _s: self.watcher.start(), on_error=self.show_error)

    def _on_download_finished(self, download: dict) -> None:
        self.statusBar().showMessage(f"Downloaded {download['repo']} {download['quant']}", 5000)
        self._refresh_models()

    def _on_new_model(self, model_id: str) -> None:
        self._refresh_models(select=model_id)

    def _refresh_models(self, select: str | None = None) -> None:
        client = self.client

        def done(result: dict) -> None:
            self._fill_models(result["models"], result["health"])
            index = self.model_box.findData(select) if select else -1
            if index >= 0:
                self.model_box.setCurrentIndex(index)
                self._on_model_chosen(index)

        start_task(lambda _t: {"health": client.health(), "models": client.models()},
                   on_done=done, on_error=self.show_error)

    # -- the memory plan ------------------------------------------------------------

    def _toggle_plan(self, shown: bool) -> None:
        self.plan_panel.setVisible(shown)
        if shown and self.model_box.currentData() != self.plan_panel.model:
            self.plan_panel.show_model(self.model_box.currentData())

    def _preview_plan(self, model: str, n_ctx, gpu_layers, cpu_moe_layers) -> None:
        if self.client and model:
            start_task(lambda _t: {**self.client.plan(model, n_ctx, gpu_layers, cpu_moe_layers),
                                   "asked": (model, n_ctx, gpu_layers, cpu_moe_layers)},
                       on_done=self.plan_panel.show_plan, on_error=self.show_error)

    def _load_model(self, model: str, n_ctx, gpu_layers, cpu_moe_layers) -> None:
        if not self.client:
            return
        self.progress.show()
        self.plan_panel.load_button.setEnabled(False)
        self.statusBar().showMessage(f"Loading {model}…")
        start_task(lambda _t: self.client.load(model, n_ctx, gpu_layers, cpu_moe_layers),
                   on_done=self._on_model_loaded, on_error=self._on_load_failed)

    def _on_model_loaded(self, health: dict) -> None:
        self.progress.hide()
        self.plan_panel.load_button.setEnabled(True)
        self.statusBar().showMessage("Loaded", 3000)
        notice = _load_notice(health)
        if notice:
            self.show_notice(notice)
        self._refresh_models()

    def _on_load_failed(self, error) -> None:
        self.progress.hide()
        self.plan_panel.load_button.setEnabled(True)
        self.statusBar().clearMessage()
        self.show_error(f"The model could not be loaded: {error}")

    def _on_system_prompt(self) -> None:
        if self.conversation:
            self.history.update(self.conversation.id,
                                system_prompt=self.system_prompt.toPlainText())
            self.conversation = self.history.get(self.conversation.id)

    def _on_sampling(self) -> None:
        self.sampling = Sampling(self.temperature.value(), self.top_p.value(),
                                 self.max_tokens.value(), self.seed.value(),
                                 self.speculation.currentData() or "off")
        save_settings(self.paths.data / "settings.json", self.sampling)

    def _show_conversation(self) -> None:
        shown = []
        if self.conversation:
            shown = [Shown(str(m.id), m.role, m.content, m.status,
                           " · ".join(p for p in (m.model, m.detail) if p))
                     for m in self.history.messages(self.conversation.id)]
            reply = self._current_reply()
            if reply:
                shown.append(Shown(STREAM_KEY, "assistant", reply.text))
        self.view.show_messages(shown)
        self._update_buttons()

    def _current_reply(self):
        return self.sessions.reply(self.conversation.id if self.conversation else None)

    # -- chatting: each conversation can have a reply on its way, all at once ---------

    def send(self, text: str) -> None:
        if not text or self.client is None or self._current_reply():
            return
        conversation = self.conversation or self.new_conversation()
        self.history.add_message(conversation.id, "user", text)
        if conversation.title == "New chat":
            self.history.update(conversation.id, title=text.splitlines()[0][:48])
            self.conversation = self.history.get(conversation.id)
            self.refresh_conversations()
        self.composer.clear()
        self._generate()

    def _generate(self, fresh: bool = False) -> None:
        """Ask for the conversation's next reply; `fresh`: never the cached answer."""
        conversation = self.conversation
        messages = self.sessions.request(conversation)
        routed = conversation.routed and self.routing.on
        options = {**self.sampling.as_request(),
                   "model": "auto" if routed else self.model_box.currentData(),
                   "response_cache": "refresh" if fresh else None}
        reply = self.sessions.start(conversation.id)
        key = conversation.id
        reply.task = start_task(_receive_reply, self.client, messages, options,
                                on_progress=lambda piece: self._on_piece(key, piece),
                                on_done=lambda done: self._on_reply(key, done),
                                on_error=lambda error: self._on_stream_failed(key, error))
        self._show_conversation()

    def _on_piece(self, conversation_id: int, piece: str) -> None:
        reply = self.sessions.feed(conversation_id, piece)
        if reply and self.conversation and self.conversation.id == conversation_id:
            self.view.set_last(Shown(STREAM_KEY, "assistant", reply.text))

    def _on_reply(self, conversation_id: int, done: StreamedReply) -> None:
        status = "stopped" if done.finish_reason == "stopped" else "complete"
        self._finish_stream(conversation_id, status, done.model, done.detail())
        if self.conversation and self.conversation.id == conversation_id:
            self.metrics.show_usage(done.usage, done.n_ctx)

    def _on_stream_failed(self, conversation_id: int, error) -> None:
        self._finish_stream(conversation_id, "interrupted")
        if self.last_death is None and self.client is not None:
            self.show_error(f"The reply failed: {error}")

    def _finish_stream(self, conversation_id: int, status: str, model: str | None = None,
                       detail: str = "") -> None:
        self.sessions.finish(conversation_id, status, model, detail)
        if self.conversation and self.conversation.id == conversation_id:
            self._show_conversation()

    def stop(self) -> None:
        reply = self._current_reply()
        if reply:
            reply.task.cancel()

    def regenerate(self) -> None:
        """Replace the last reply with a new one."""
        if not self.conversation or self._current_reply() or self.client is None:
            return
        messages = self.history.messages(self.conversation.id)
        if messages and messages[-1].role == "assistant":
            self.history.delete_messages_from(self.conversation.id, messages[-1].id)
        if self.history.messages(self.conversation.id):
            self._generate(fresh=True)  # a new answer, not the cached one

    def edit_last(self) -> None:
        """Put the last prompt back into the composer and drop it and what followed."""
        if not self.conversation or self._current_reply():
            return
        users = [m for m in self.history.messages(self.conversation.id) if m.role == "user"]
        if users:
            self.history.delete_messages_from(self.conversation.id, users[-1].id)
            self.composer.setPlainText(users[-1].content)
            self.composer.setFocus()
            self._show_conversation()

    def closeEvent(self, event) -> None:
        self.watchdog.stop()
        self.cluster_timer.stop()
        if self.shared:
            self.shared.stop()
        for reply in self.sessions.running():
            reply.task.cancel()
        self.supervisor.stop()
        self.history.close()
        super().closeEvent(event)


def paths_icon() -> QIcon | None:
    from .resources import icon_path

    path = icon_path()
    return QIcon(str(path)) if path.exists() else None
