"""The models: the picker's list and state, the model's sampling defaults in Settings, the
Memory page's plan and load, the routing pair, the wizard and the downloads. Work runs
off the UI thread; answers come back to the window's widgets."""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer

from app.history import SavedConversation

from .download_wizard import ModelWizard
from .model_bar import describe_plan, describe_state
from .tasks import start_task


KINDS_POLL_MS, KINDS_POLLS = 1000, 120  # a damaged file stays unread: not forever


def _device_text(health: dict) -> str:
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


REGENERATE_TEMPERATURE = 0.6


class ModelControl(QObject):
    def __init__(self, window):
        super().__init__(window)
        self.w = window
        self.models: list[dict] = []
        self.adapters: list[dict] = []  # LoRA adapters, with the models they fit
        self._polls = 0  # refreshes while the engine reads files' headers
        self.health: dict = {}
        self.wizard: ModelWizard | None = None
        self._plans: dict[str, dict] = {}  # not-loaded models' plans, asked once per refresh
        self._watch = QTimer(self, interval=300)  # while a model loads: how far it is
        self._watch.timeout.connect(self._show_loading)

    def is_loaded(self, model: str | None) -> bool:
        """The model is held and ready, as the default one or beside it (one still
        loading when the health was read is not: the next refresh says more)."""
        return any(m["id"] == model and m["state"] == "ready"
                   for m in self.health.get("models") or ())

    def fill(self, models: list[dict], health: dict) -> None:
        # A refresh keeps what the box shows: two refreshes can finish in either order
        # (the wizard's, which selects the new model, and the downloads watcher's).
        w = self.w
        current = (w.bar.box.currentData() or (w.conversation and w.conversation.model)
                   or health.get("model"))
        # embedding models cannot chat; "auto" is the conversation's Auto-route box;
        # adapters are chosen over their base model
        self.models = [m for m in models if m.get("kind") not in ("embedding", "router",
                                                                   "adapter")]
        self.adapters = [m for m in models if m.get("kind") == "adapter"]
        self.health = health
        self._plans = {}  # models and health changed: plans may have too
        w.bar.fill(self.models, current)
        w.settings.fill_models(self.models)
        self.show_state()
        w.metrics.set("device", _device_text(health))
        unread = any(m.get("kind") is None for m in models)
        self._polls = self._polls + 1 if unread else 0
        if unread and w.client and self._polls <= KINDS_POLLS:
            # the engine is still reading some files' headers (it does at every start):
            # their kinds (an adapter, an embedding model) decide where they are offered
            QTimer.singleShot(KINDS_POLL_MS, self.refresh)

    def show_state(self, loading: bool = False) -> None:
        w = self.w
        chosen = w.bar.box.currentData()
        w.bar.state.setText(describe_state(chosen, self.health, loading))
        if chosen and not self.is_loaded(chosen) and not loading and w.client:
            self._forecast(chosen)
        entry = next((m for m in self.models if m["id"] == chosen), {})
        w.settings.show_model_defaults(entry.get("sampling_defaults"))
        routed = bool(w.conversation and w.conversation.routed and w.settings.routing.on)
        w.bar.box.setEnabled(not routed)  # "auto" picks the model of each reply
        w.bar.fill_adapters([] if routed else self.adapters_for(chosen),
                            w.conversation.adapters if w.conversation else ())
        w.bar.auto_route.setEnabled(w.settings.routing.on)
        w.bar.show_reasoning(None if routed else entry.get("capabilities"))

    def _forecast(self, model: str) -> None:
        """For a model not loaded: where it would run and how fast, from its plan (asked
        once, not on every change of the chat)."""
        client, state, box = self.w.client, self.w.bar.state, self.w.bar.box

        def show(plan: dict) -> None:
            self._plans[model] = plan
            if box.currentData() == model and not self.is_loaded(model):
                state.setText(describe_plan(plan))

        if model in self._plans:
            show(self._plans[model])
        else:  # an error: the Memory page says why
            start_task(lambda _t: client.plan(model), on_done=show, on_error=lambda _e: None,
                       owner=self.w)

    def adapters_for(self, model: str | None) -> list[str]:
        """The adapters that fit `model`."""
        return [a["id"] for a in self.adapters if model in (a.get("bases") or ())]

    def choose_adapters(self, chosen: tuple) -> None:
        """The conversation's adapters (switched at the next reply; no reload)."""
        w = self.w
        conversation = w.conversation or w.new_conversation()
        w.history.update(conversation.id, adapters=chosen)
        w.chat.conversation = w.history.get(conversation.id)
        self.show_state()

    def choose(self, model: str) -> None:
        w = self.w
        if w.conversation:
            w.history.update(w.conversation.id, model=model)
        self.show_state()
        if model and not self.is_loaded(model):  # show what loading it will take
            w.drawer.open_page("Memory")
            w.plan_panel.show_model(model)

    def request_options(self, conversation: SavedConversation, another: bool = False) -> dict:
        """The request's model and sampling. `another`: Regenerate, which asks for a
        different answer: where the model decodes greedily by default (the smallest do)
        and the user chose no temperature, that one answer is sampled at 0.6."""
        routed = conversation.routed and self.w.settings.routing.on
        options = {**self.w.settings.sampling.as_request(),
                   "model": "auto" if routed else self.w.bar.box.currentData()}
        fitting = self.adapters_for(options["model"])
        chosen = [{"id": n, "scale": s} for n, s in conversation.adapters if n in fitting]
        if chosen and not routed:
            options["lora"] = chosen
        entry = next((m for m in self.models if m["id"] == options["model"]), {})
        if not routed and self.w.bar.reasoning_effort():
            options["reasoning_effort"] = self.w.bar.reasoning_effort()
        greedy = (entry.get("sampling_defaults") or {}).get("temperature") == 0
        if another and greedy and "temperature" not in options:
            options["temperature"] = REGENERATE_TEMPERATURE
        return options

    def chosen(self) -> str | None:
        return self.w.bar.box.currentData()

    def context_size(self) -> int:
        return int(self.health.get("n_ctx") or 4096)

    def after_reply(self, model: str | None) -> None:
        """A reply came from `model`: when it was not loaded, the engine loaded it (as
        the default, or beside it), so the list and the state change."""
        if model and not self.is_loaded(model) and self.w.client:
            self.refresh()

    def refresh(self, select: str | None = None) -> None:
        client, box = self.w.client, self.w.bar.box

        def done(result: dict) -> None:
            self.fill(result["models"], result["health"])
            if select and box.findData(select) >= 0:
                box.setCurrentIndex(box.findData(select))
                self.choose(select)

        start_task(lambda _t: {"health": client.health(), "models": client.models()},
                   on_done=done, on_error=self.w.show_error, owner=self.w)

    # -- the routing pair ----------------------------------------------------------------

    def apply_routing(self) -> None:
        """Give the engine the pair (also after it restarts); its plan says whether both
        models stay loaded or each switch swaps them."""
        client, pair, settings = self.w.client, self.w.settings.routing, self.w.settings
        if client is None:
            return
        self.show_state()
        start_task(lambda _t: client.set_routing(pair.small, pair.large, pair.mode),
                   on_done=lambda answer: settings.route_state.setText(
                       answer["plan"]["note"] if answer.get("plan") else "Routing is off."),
                   on_error=self._on_routing_failed, owner=self.w)

    def _on_routing_failed(self, error) -> None:
        self.w.settings.routing_failed()
        self.show_state()
        self.w.show_error(f"Routing could not be set: {error}")

    # -- the Memory page: the plan, and loading by it ---------------------------------------

    def preview_plan(self, model: str, n_ctx, gpu_layers, cpu_moe_layers) -> None:
        client = self.w.client
        if client and model:
            start_task(lambda _t: {**client.plan(model, n_ctx, gpu_layers, cpu_moe_layers),
                                   "asked": (model, n_ctx, gpu_layers, cpu_moe_layers)},
                       on_done=self.w.plan_panel.show_plan, on_error=self.w.show_error,
                       owner=self.w)

    def load(self, model: str, n_ctx, gpu_layers, cpu_moe_layers) -> None:
        client, w = self.w.client, self.w
        if not client:
            return
        w.progress.show()
        w.plan_panel.load_button.setEnabled(False)
        w.statusBar().showMessage(f"Loading {model}…")
        self.show_state(loading=True)
        self._watch.start()
        start_task(lambda _t: client.load(model, n_ctx, gpu_layers, cpu_moe_layers),
                   on_done=self._on_loaded, on_error=self._on_load_failed, owner=self.w)

    def _show_loading(self) -> None:
        client, state = self.w.client, self.w.bar.state

        def show(health: dict) -> None:
            loading = health.get("loading")
            if loading and self._watch.isActive():
                state.setText(f"Loading {loading['model']}… {loading['progress']:.0%}")

        if client:
            start_task(lambda _t: client.health(), on_done=show, on_error=lambda _e: None,
                       owner=self.w)

    def _on_loaded(self, health: dict) -> None:
        w = self.w
        self._watch.stop()
        w.progress.hide()
        w.plan_panel.load_button.setEnabled(True)
        w.statusBar().showMessage("Loaded", 3000)
        if load_notice(health):
            w.show_notice(load_notice(health))
        self.refresh()

    def _on_load_failed(self, error) -> None:
        w = self.w
        self._watch.stop()
        w.progress.hide()
        w.plan_panel.load_button.setEnabled(True)
        w.statusBar().clearMessage()
        self.show_state()
        w.show_error(f"The model could not be loaded: {error}")

    # -- getting models: the wizard and the downloads page --------------------------------

    def open_wizard(self) -> None:
        if not self.w.client:
            self.w.show_notice("The engine is still starting: the model wizard opens once "
                               "it is ready.")
            return
        if self.wizard is None:  # one wizard; reopened as it was (a download may be on)
            self.wizard = ModelWizard(self.w.client, self.w.watcher, self.w)
            self.wizard.model_ready.connect(lambda model_id: self.refresh(select=model_id))
            self.wizard.finished.connect(lambda _r: setattr(self, "wizard", None))
        self.wizard.show()
        self.wizard.raise_()

    def control_download(self, download_id: int, action: str) -> None:
        client = self.w.client
        if client:
            start_task(lambda _t: client.control_download(download_id, action),
                       on_done=lambda _s: self.w.watcher.start(), on_error=self.w.show_error,
                       owner=self.w)

    def on_download_finished(self, download: dict) -> None:
        self.w.statusBar().showMessage(f"Downloaded {download['repo']} {download['quant']}", 5000)
        self.refresh()
