"""The models: the engine's list and health into the window's state, the chosen model's
state in words (loaded, loading, its forecast), the Memory page's plan and load, the
routing pair, the wizard and the downloads. Work runs off the UI thread; what it finds
goes into the state (ui/state.py) and the widgets it is given, and what the window
shows (errors, notices, the status line) leaves as signals."""

from __future__ import annotations

from typing import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from app.chat_state import listed
from app.client import EngineClient
from app.history import History, SavedConversation

from ..state import WindowState
from ..tasks import start_task
from .download_wizard import ModelWizard
from .downloads_panel import DownloadWatcher
from .model_bar import ModelBar, describe_plan, describe_state
from .plan_panel import PlanPanel

KINDS_POLL_MS, KINDS_POLLS = 1000, 120  # a damaged file stays unread: not forever


def device_text(health: dict) -> str:
    """Where the model runs and what it took, against the planner's prediction."""
    devices = (health.get("memory") or {}).get("devices") or []
    if not devices:
        return ""
    used = sum(d["measured_bytes"] for d in devices) / 2**20
    planned = sum(d["predicted_bytes"] for d in devices) / 2**20
    return f"{health.get('offload', 'CPU')} · {used:,.0f} MiB (planned {planned:,.0f})"


def load_notice(health: dict) -> str:
    """What the engine changed to load the model (memory ran out, a crash before)."""
    notes = health.get("load_notes")
    return "Loaded with a safer plan: " + "; ".join(notes) + "." if notes else ""


class ModelControl(QObject):
    error = Signal(str)
    notice = Signal(str)
    status = Signal(str, int)  # a status-bar message and for how long (ms; 0: until replaced)
    busy = Signal(bool)  # a model is loading
    open_page = Signal(str)  # a drawer page to show
    device = Signal(str)  # where the model runs, for the status bar
    routing_note = Signal(str)  # the engine's word on the routing pair
    routing_failed = Signal()

    def __init__(self, state: WindowState, client: Callable[[], EngineClient | None],
                 history: History, new_conversation: Callable[[], SavedConversation],
                 bar: ModelBar, plan_panel: PlanPanel, watcher: DownloadWatcher):
        super().__init__(bar)
        self.state, self.client, self.history = state, client, history
        self.new_conversation = new_conversation
        self.bar, self.plan_panel, self.watcher = bar, plan_panel, watcher
        self._polls = 0  # refreshes while the engine reads files' headers
        self._loading = False
        self.wizard: ModelWizard | None = None
        self._plans: dict[str, dict] = {}  # not-loaded models' plans, asked once per refresh
        self._watch = QTimer(self, interval=300)  # while a model loads: how far it is
        self._watch.timeout.connect(self._show_loading)
        state.changed.connect(self._on_changed)

    def fill(self, models: list[dict], health: dict) -> None:
        # A refresh keeps the model chosen: two refreshes can finish in either order
        # (the wizard's, which selects the new model, and the downloads watcher's).
        now = self.state.now
        current = now.model or (now.conversation and now.conversation.model) or \
            health.get("model")
        chat, adapters = listed(models)
        if current not in {m["id"] for m in chat}:
            current = chat[0]["id"] if chat else None
        self._plans = {}  # models and health changed: plans may have too
        self.state.update(models=chat, adapters=adapters, health=health, model=current)
        self.device.emit(device_text(health))
        unread = any(m.get("kind") is None for m in models)
        self._polls = self._polls + 1 if unread else 0
        if unread and self.client() and self._polls <= KINDS_POLLS:
            # the engine is still reading some files' headers (it does at every start):
            # their kinds (an adapter, an embedding model) decide where they are offered
            QTimer.singleShot(KINDS_POLL_MS, self.refresh)

    def _on_changed(self, names: frozenset) -> None:
        if names & {"model", "models", "health", "conversation", "routing"}:
            self.show_state()

    def show_state(self) -> None:
        """The chosen model's state in words; for one not loaded, its plan's forecast."""
        now = self.state.now
        self.bar.state.setText(describe_state(now.model, now.health, self._loading))
        if now.model and not now.is_loaded(now.model) and not self._loading and self.client():
            self._forecast(now.model)

    def _forecast(self, model: str) -> None:
        """For a model not loaded: where it would run and how fast, from its plan (asked
        once, not on every change of the chat)."""
        client, state = self.client(), self.bar.state

        def show(plan: dict) -> None:
            self._plans[model] = plan
            if self.state.now.model == model and not self.state.now.is_loaded(model):
                state.setText(describe_plan(plan))

        if model in self._plans:
            show(self._plans[model])
        else:  # an error: the Memory page says why
            start_task(lambda _t: client.plan(model), on_done=show, on_error=lambda _e: None,
                       owner=self)

    def choose_adapters(self, chosen: tuple) -> None:
        """The conversation's adapters (switched at the next reply; no reload)."""
        conversation = self.state.now.conversation or self.new_conversation()
        self.history.update(conversation.id, adapters=chosen)
        self.state.update(conversation=self.history.get(conversation.id))

    def choose(self, model: str) -> None:
        conversation = self.state.now.conversation
        if conversation:
            self.history.update(conversation.id, model=model)
            conversation = self.history.get(conversation.id)
        self.state.update(model=model or None, conversation=conversation)
        if model and not self.state.now.is_loaded(model):  # what loading it will take
            self.open_page.emit("Memory")
            self.plan_panel.show_model(model)

    def after_reply(self, model: str | None) -> None:
        """A reply came from `model`: when it was not loaded, the engine loaded it (as
        the default, or beside it), so the list and the state change."""
        if model and not self.state.now.is_loaded(model) and self.client():
            self.refresh()

    def refresh(self, select: str | None = None) -> None:
        client = self.client()

        def done(result: dict) -> None:
            self.fill(result["models"], result["health"])
            if select and self.state.now.entry(select):
                self.choose(select)

        start_task(lambda _t: {"health": client.health(), "models": client.models()},
                   on_done=done, on_error=lambda e: self.error.emit(str(e)), owner=self)

    def sources_changed(self) -> None:
        """The user changed where models are found: the engine reads the choice again and
        looks; then the list shows what it found (an engine not started yet reads it when
        it starts)."""
        client = self.client()
        if client is not None:
            start_task(lambda _t: client.choose_source(), on_done=lambda _s: self.refresh(),
                       on_error=lambda e: self.error.emit(str(e)), owner=self)

    # -- the routing pair ----------------------------------------------------------------

    def apply_routing(self) -> None:
        """Give the engine the pair (also after it restarts); its plan says whether both
        models stay loaded or each switch swaps them."""
        client, pair = self.client(), self.state.now.routing
        if client is None:
            return
        start_task(lambda _t: client.set_routing(pair.small, pair.large, pair.mode),
                   on_done=lambda answer: self.routing_note.emit(
                       answer["plan"]["note"] if answer.get("plan") else "Routing is off."),
                   on_error=self._on_routing_failed, owner=self)

    def _on_routing_failed(self, error) -> None:
        self.routing_failed.emit()
        self.error.emit(f"Routing could not be set: {error}")

    # -- the Memory page: the plan, and loading by it ---------------------------------------

    def preview_plan(self, model: str, *choices) -> None:
        """`choices`: the plan panel's overrides (context, GPU layers, experts, vision)."""
        client = self.client()
        if client and model:
            start_task(lambda _t: {**client.plan(model, *choices), "asked": (model, *choices)},
                       on_done=self.plan_panel.show_plan,
                       on_error=lambda e: self.error.emit(str(e)), owner=self)

    def load(self, model: str, *choices) -> None:
        client = self.client()
        if not client:
            return
        self._set_loading(True)
        self.status.emit(f"Loading {model}…", 0)
        self._watch.start()
        start_task(lambda _t: client.load(model, *choices),
                   on_done=self._on_loaded, on_error=self._on_load_failed, owner=self)

    def _set_loading(self, loading: bool) -> None:
        self._loading = loading
        if not loading:
            self._watch.stop()
        self.busy.emit(loading)
        self.plan_panel.load_button.setEnabled(not loading)
        self.show_state()

    def _show_loading(self) -> None:
        client, state = self.client(), self.bar.state

        def show(health: dict) -> None:
            loading = health.get("loading")
            if loading and self._watch.isActive():
                state.setText(f"Loading {loading['model']}… {loading['progress']:.0%}")

        if client:
            start_task(lambda _t: client.health(), on_done=show, on_error=lambda _e: None,
                       owner=self)

    def _on_loaded(self, health: dict) -> None:
        self._set_loading(False)
        self.status.emit("Loaded", 3000)
        if load_notice(health):
            self.notice.emit(load_notice(health))
        self.refresh()

    def _on_load_failed(self, error) -> None:
        self._set_loading(False)
        self.status.emit("", 0)
        self.error.emit(f"The model could not be loaded: {error}")

    # -- getting models: the wizard and the downloads page --------------------------------

    def open_wizard(self) -> None:
        if not self.client():
            self.notice.emit("The engine is still starting: the model wizard opens once "
                             "it is ready.")
            return
        if self.wizard is None:  # one wizard; reopened as it was (a download may be on)
            self.wizard = ModelWizard(self.client(), self.watcher, self.bar.window())
            self.wizard.model_ready.connect(lambda model_id: self.refresh(select=model_id))
            self.wizard.finished.connect(lambda _r: setattr(self, "wizard", None))
        self.wizard.show()
        self.wizard.raise_()

    def control_download(self, download_id: int, action: str) -> None:
        client = self.client()
        if client:
            start_task(lambda _t: client.control_download(download_id, action),
                       on_done=lambda _s: self.watcher.start(),
                       on_error=lambda e: self.error.emit(str(e)), owner=self)

    def on_download_finished(self, download: dict) -> None:
        self.status.emit(f"Downloaded {download['repo']} {download['quant']}", 5000)
        self.refresh()
