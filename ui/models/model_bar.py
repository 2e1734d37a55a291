"""The bar above the chat: the model picker with its state (loaded, loading, not loaded),
where it runs and how fast it is forecast to write; adapters, reasoning, routing and
getting models. It shows the window's state (ui/state.py) and says what the user chose."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtGui import QActionGroup
from PySide6.QtWidgets import (QCheckBox, QComboBox, QGridLayout, QMenu, QPushButton,
                               QSizePolicy, QToolButton, QWidget)

from app.chat_state import ChatState
from app.client import adapter_text

from ..safe_text import Label
from ..state import WindowState

ADAPTER_SCALES = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5)  # 0: off
LOADED_MARK = "● "  # before a model held in memory

def describe_state(chosen: str | None, health: dict, loading: bool = False) -> str:
    """The chosen model's state in a few words."""
    if loading:
        return "Loading…"
    if not chosen:
        return "No model: get one with “Get models…”"
    beside = next((m for m in health.get("models") or () if m["id"] == chosen), None)
    if health.get("model") != chosen and beside is not None:
        return describe_beside(beside)
    if health.get("model") != chosen:
        return "Not loaded: it loads when you send (Memory shows the plan)"
    plan = (health.get("memory") or {}).get("plan") or {}
    speed = (plan.get("forecast") or {}).get("decode_tokens_per_s")
    where = health.get("offload") or "CPU"
    if where == "CPU" and health.get("no_gpu_driver"):  # a GPU build, and no GPU found
        where = "the CPU: no GPU driver found"
    return f"Loaded · runs on {where}" + (f" · about {speed:.0f} tokens/s" if speed else "")


def describe_beside(entry: dict) -> str:
    """A model loaded beside the default one (engine/fleet.py): how long it stays."""
    if entry["state"] == "loading":
        return "Loading beside the default model…"
    keep = ("pinned: stays loaded" if entry["pinned"] else "stays loaded"
            if entry["ttl_s"] is None else f"unloads after {entry['ttl_s'] / 60:g} min idle")
    gib = sum(entry["memory"].values()) / 2**30
    return f"Loaded beside the default model · {gib:.1f} GiB · {keep}"


def describe_plan(plan: dict) -> str:
    """A model not loaded, by its plan: whether it fits, where, how fast."""
    if not plan.get("fits"):
        return "Not loaded · does not fit this machine (Memory says why)"
    where = f"{plan['n_gpu_layers']} layers on the GPU" if plan.get("n_gpu_layers") else "CPU"
    speed = (plan.get("forecast") or {}).get("decode_tokens_per_s")
    return (f"Not loaded: loads when you send · would run on {where}"
            + (f" · about {speed:.0f} tokens/s" if speed else ""))


REASONING_NAMES = {None: "Thinking: default", "none": "Thinking: off", "low": "Thinking: low",
                   "medium": "Thinking: medium", "high": "Thinking: high"}


def badges(capabilities: list[str] | None) -> str:
    """What the model's template says it does, as words after its name."""
    words = [word for cap, word in (("reasoning", "thinks"), ("tools", "tools"),
                                    ("vision", "sees images"))
             if cap in (capabilities or ())]
    return "  · " + " · ".join(words) if words else ""


def reasoning_controls(capabilities: list[str] | None) -> tuple[str | None, ...]:
    """The reasoning choices a model takes: none unless it thinks; off only where its
    template can turn thinking off, low to high where it takes an effort."""
    caps = capabilities or ()
    if "reasoning" not in caps:
        return ()
    efforts = ("low", "medium", "high") if "reasoning_effort" in caps else ()
    return (None, *(("none",) if "thinking_toggle" in caps else ()), *efforts)


def describe_adapters(chosen: tuple[tuple[str, float], ...]) -> str:
    """The adapters button's text: what the conversation's replies are adapted with."""
    if not chosen:
        return "No adapter"
    return "Adapter: " + ", ".join(adapter_text(name, scale) for name, scale in chosen)


class ModelBar(QWidget):
    chosen = Signal(str)
    get_models = Signal()
    adapters_chosen = Signal(tuple)  # ((adapter id, scale), ...)
    reasoning_chosen = Signal(object)  # the effort (None: the model's default)

    def __init__(self, state: WindowState, parent=None):
        super().__init__(parent)
        self._state = state
        self.box = QComboBox(accessibleName="Model")
        self.box.setMinimumWidth(200)
        self.box.setMaximumWidth(420)
        self.box.activated.connect(lambda _i: self.chosen.emit(self.box.currentData() or ""))
        self.state = Label(objectName="muted", wordWrap=True)
        self.state.setAccessibleName("Model state")
        self.auto_route = QCheckBox("Auto-route", accessibleName="Auto-route")
        self.auto_route.setToolTip("Send each reply of this conversation to the small or the "
                                   "large model of the routing pair (Settings)")
        self.adapters = QToolButton(accessibleName="Adapters",
                                    popupMode=QToolButton.ToolButtonPopupMode.InstantPopup)
        self.adapters.setToolTip("LoRA adapters over this model, for this conversation: "
                                 "switched at once, no reload")
        self.adapters.setMenu(QMenu(self.adapters))
        self._chosen_adapters: tuple = ()
        self.thinking = QComboBox(accessibleName="Reasoning")
        self.thinking.setToolTip("How much the model thinks before it answers (models whose "
                                 "chat template takes it)")
        self.thinking.setVisible(False)
        self.thinking.activated.connect(
            lambda _i: self.reasoning_chosen.emit(self.reasoning_effort()))
        self.get = QPushButton("Get models…", accessibleName="Get models")
        self.get.clicked.connect(self.get_models)
        # the controls in one row, the state under them all: it keeps one line in a
        # narrow window
        layout = QGridLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setVerticalSpacing(2)
        self.box.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        layout.addWidget(self.box, 0, 0)
        layout.setColumnStretch(0, 4)  # the picker takes most of the room up to its 420 px
        layout.setColumnStretch(1, 1)
        layout.addWidget(self.thinking, 0, 1)
        layout.addWidget(self.adapters, 0, 2)
        layout.addWidget(self.auto_route, 0, 3)
        layout.addWidget(self.get, 0, 4)
        layout.addWidget(self.state, 1, 0, 1, 5)
        self.fill_adapters([], ())
        state.changed.connect(self._on_changed)

    def _on_changed(self, names: frozenset) -> None:
        now = self._state.now
        if "models" in names:
            self.fill(now.models, now.model)
        elif "model" in names and self.box.currentData() != now.model:
            self.box.setCurrentIndex(max(self.box.findData(now.model), 0))
        if names & {"model", "models", "adapters", "conversation", "routing"}:
            self._show_choices(now)

    def _show_choices(self, now: ChatState) -> None:
        """What the chosen model and the conversation offer: adapters, reasoning, routing
        ("auto" picks the model of each reply: the picker is off)."""
        routed = now.routed
        self.box.setEnabled(not routed)
        self.fill_adapters([] if routed else now.adapters_for(now.model),
                           now.conversation.adapters if now.conversation else ())
        self.auto_route.setEnabled(now.routing.on)
        self.auto_route.blockSignals(True)
        self.auto_route.setChecked(bool(now.conversation and now.conversation.routed))
        self.auto_route.blockSignals(False)
        self.show_reasoning(None if routed else now.entry().get("capabilities"))
        if self.reasoning_effort() != now.reasoning:  # a choice the new model does not take
            self.reasoning_chosen.emit(self.reasoning_effort())

    def fill(self, models: list[dict], current: str | None) -> None:
        self.box.clear()
        for model in models:  # a loaded model marked first: a long id is cut at the end
            loaded = LOADED_MARK if model.get("loaded") else ""
            there = f", from {model['source_label']}" if model.get("source", "homerack") \
                != "homerack" else ""
            self.box.addItem(f"{loaded}{model['id']}  ({model['size_bytes'] / 2**20:,.0f} MiB"
                             f"{there}){badges(model.get('capabilities'))}", model["id"])
        self.box.setCurrentIndex(max(self.box.findData(current), 0))

    def show_reasoning(self, capabilities: list[str] | None) -> None:
        """The reasoning control, with the choices the chosen model takes (hidden for a
        model that does not think); the choice made stays where it still applies."""
        kept = self.reasoning_effort()
        choices = reasoning_controls(capabilities)
        self.thinking.clear()
        for effort in choices:
            self.thinking.addItem(REASONING_NAMES[effort], effort)
        if kept in choices:
            self.thinking.setCurrentIndex(choices.index(kept))
        self.thinking.setVisible(bool(choices))

    def reasoning_effort(self) -> str | None:
        return self.thinking.currentData() if self.thinking.count() else None

    def fill_adapters(self, available: list[str], chosen: tuple[tuple[str, float], ...]) -> None:
        """The adapters that fit the chosen model, each with its scales; hidden when none
        does. `chosen`: the conversation's, among them."""
        self._chosen_adapters = tuple((n, s) for n, s in chosen if n in available)
        menu = self.adapters.menu()
        menu.clear()
        for name in available:
            scales = menu.addMenu(name)
            group = QActionGroup(scales)
            current = dict(self._chosen_adapters).get(name, 0.0)
            for scale in ADAPTER_SCALES:
                action = scales.addAction(f"×{scale:g}" if scale else "Off")
                action.setCheckable(True)
                action.setChecked(scale == current)
                group.addAction(action)
                action.triggered.connect(lambda _c=False, n=name, s=scale: self._choose(n, s))
        self.adapters.setText(describe_adapters(self._chosen_adapters))
        self.adapters.setVisible(bool(available))

    def _choose(self, name: str, scale: float) -> None:
        chosen = dict(self._chosen_adapters)
        chosen.pop(name, None)
        if scale:
            chosen[name] = scale
        self.adapters_chosen.emit(tuple(sorted(chosen.items())))
