"""Settings: the conversation's system prompt, sampling (each model's own defaults unless
the user picks a value), speculative decoding, the routing pair, and where models are
found (sources_panel.py). It keeps its own files (settings.json, routing.json) and puts
what they hold into the window's state (ui/state.py), which it observes for the
conversation and the models; the window hands the routing pair to the engine."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (QCheckBox, QComboBox, QDoubleSpinBox, QFormLayout,
                               QPlainTextEdit, QPushButton, QSpinBox, QWidget)

from app.settings import (IMAGE_URLS, RoutingChoice, Sampling, load_sampling, load_settings,
                          save_settings, switch, switched_on)

from ..safe_text import Label
from ..state import WindowState
from .sources_panel import SourcesPanel

UNSET = {"temperature": -0.05, "top_p": 0.0}  # the spin boxes' "model default" values


class SettingsPage(QWidget):
    system_prompt_changed = Signal(str)
    routing_chosen = Signal(object)  # RoutingChoice

    def __init__(self, data: Path, state: WindowState, parent=None):
        super().__init__(parent)
        self.data, self._state = data, state
        state.update(sampling=load_sampling(data / "settings.json"),
                     routing=load_settings(data / "routing.json", RoutingChoice))
        self.system_prompt = QPlainTextEdit(placeholderText="System prompt for this conversation",
                                            accessibleName="System prompt")
        self.system_prompt.setMaximumHeight(90)
        self.system_prompt.textChanged.connect(
            lambda: self.system_prompt_changed.emit(self.system_prompt.toPlainText()))
        self.temperature = self._spin("Temperature", UNSET["temperature"], 2, 0.05)
        self.top_p = self._spin("Top-p", UNSET["top_p"], 1, 0.05)
        self.max_tokens = QSpinBox(minimum=1, maximum=32768, accessibleName="Maximum tokens")
        self.seed = QSpinBox(minimum=-1, maximum=2**31 - 1, specialValueText="random",
                             accessibleName="Seed")
        self.speculation = QComboBox(accessibleName="Speculative decoding")
        self.reset = QPushButton("Use the model's defaults", accessibleName="Reset sampling")
        self.reset.clicked.connect(self.reset_sampling)
        self.defaults_note = Label(objectName="muted", wordWrap=True)
        self._show_sampling()
        for widget in (self.temperature, self.top_p, self.max_tokens, self.seed):
            widget.valueChanged.connect(self._on_sampling)
        self.speculation.currentIndexChanged.connect(self._on_sampling)
        form = QFormLayout(self)
        form.setRowWrapPolicy(QFormLayout.WrapLongRows)  # labels above fields when narrow
        form.addRow(Label("System prompt"), self.system_prompt)
        form.addRow(Label("Temperature"), self.temperature)
        form.addRow(Label("Top-p"), self.top_p)
        form.addRow("", self.reset)
        form.addRow("", self.defaults_note)
        form.addRow(Label("Max tokens"), self.max_tokens)
        form.addRow(Label("Seed"), self.seed)
        form.addRow(Label("Speculative decoding"), self.speculation)
        self._build_routing(form)
        self.sources = SourcesPanel(data)
        form.addRow(Label("Models elsewhere"))
        form.addRow(self.sources)
        self.image_urls = QCheckBox("Fetch pictures that requests name by web address",
                                    accessibleName="Fetch pictures from web addresses")
        self.image_urls.setChecked(switched_on(data, IMAGE_URLS))
        self.image_urls.toggled.connect(lambda on: switch(self.data, IMAGE_URLS, on))
        form.addRow(Label("Pictures"))
        form.addRow(self.image_urls)
        form.addRow(Label("Off, programs send pictures whole (data URLs); on, the engine "
                          "also fetches the web addresses a request names, public ones only "
                          "(never this computer or your own network). Applies the next time "
                          "Homerack starts.", objectName="muted", wordWrap=True))
        self.fill_models([])
        state.changed.connect(self._on_changed)

    def _on_changed(self, names: frozenset) -> None:
        now = self._state.now
        if "models" in names:
            self.fill_models(now.models)
        if names & {"model", "models"}:
            self.show_model_defaults(now.entry().get("sampling_defaults"))
        if "conversation" in names and now.conversation and \
                now.conversation.system_prompt != self.system_prompt.toPlainText():
            self.system_prompt.blockSignals(True)
            self.system_prompt.setPlainText(now.conversation.system_prompt)
            self.system_prompt.blockSignals(False)

    def _spin(self, name: str, unset: float, top: float, step: float) -> QDoubleSpinBox:
        spin = QDoubleSpinBox(minimum=unset, maximum=top, singleStep=step, decimals=2,
                              accessibleName=name)
        spin.setSpecialValueText("model default")
        return spin

    def _build_routing(self, form: QFormLayout) -> None:
        self.route_small, self.route_large = QComboBox(), QComboBox()
        self.route_small.setAccessibleName("Small model of the routing pair")
        self.route_large.setAccessibleName("Large model of the routing pair")
        self.route_mode = QComboBox(accessibleName="Routing mode")
        for label, value in (("Rules", "rules"), ("Cascade", "cascade")):
            self.route_mode.addItem(label, value)
        self.route_mode.setCurrentIndex(
            max(self.route_mode.findData(self._state.now.routing.mode), 0))
        self.route_apply = QPushButton("Apply", accessibleName="Apply the routing pair")
        self.route_apply.clicked.connect(self._choose_routing)
        self.route_state = Label(objectName="muted", wordWrap=True)
        form.addRow(Label("Routing: small"), self.route_small)
        form.addRow(Label("Routing: large"), self.route_large)
        form.addRow(Label("Routing by"), self.route_mode)
        form.addRow("", self.route_apply)
        form.addRow("", self.route_state)

    # -- sampling -------------------------------------------------------------------

    def show_model_defaults(self, defaults: dict | None) -> None:
        """Name the model's own values where the user has not chosen one."""
        if not defaults:
            self.temperature.setSpecialValueText("model default")
            self.top_p.setSpecialValueText("model default")
            self.defaults_note.setText("")
            return
        self.temperature.setSpecialValueText(f"model default ({defaults['temperature']:g})")
        self.top_p.setSpecialValueText(f"model default ({defaults['top_p']:g})")
        self.defaults_note.setText(f"The model's defaults come from {defaults['source']}.")

    def reset_sampling(self) -> None:
        self.temperature.setValue(UNSET["temperature"])
        self.top_p.setValue(UNSET["top_p"])

    def _show_sampling(self) -> None:
        chosen = self._state.now.sampling
        self.temperature.setValue(UNSET["temperature"] if chosen.temperature is None
                                  else chosen.temperature)
        self.top_p.setValue(UNSET["top_p"] if chosen.top_p is None else chosen.top_p)
        self.max_tokens.setValue(chosen.max_tokens)
        self.seed.setValue(chosen.seed)

    def _on_sampling(self) -> None:
        def chosen(spin, unset):
            return None if spin.value() <= unset + 1e-9 else spin.value()

        sampling = Sampling(chosen(self.temperature, UNSET["temperature"]),
                            chosen(self.top_p, UNSET["top_p"]), self.max_tokens.value(),
                            self.seed.value(), self.speculation.currentData() or "off")
        self._state.update(sampling=sampling)
        save_settings(self.data / "settings.json", sampling)

    # -- the models in the choices ----------------------------------------------------

    def fill_models(self, models: list[dict]) -> None:
        """Speculation's drafts and the routing pair offer every chat model."""
        self.speculation.blockSignals(True)
        self.speculation.clear()
        choices = [("Off", "off"), ("Prompt lookup", "lookup"),
                   ("Draft model: automatic", "draft:auto")]
        choices += [(f"Draft model: {m['id']}", f"draft:{m['id']}") for m in models]
        for label, value in choices:
            self.speculation.addItem(label, value)
        self.speculation.setCurrentIndex(
            max(self.speculation.findData(self._state.now.sampling.speculation), 0))
        self.speculation.blockSignals(False)
        routing = self._state.now.routing
        for box, chosen in ((self.route_small, routing.small), (self.route_large, routing.large)):
            box.clear()
            box.addItem("Off", "")
            for model in models:
                box.addItem(model["id"], model["id"])
            box.setCurrentIndex(max(box.findData(chosen), 0))

    def _choose_routing(self) -> None:
        routing = RoutingChoice(self.route_small.currentData() or "",
                              self.route_large.currentData() or "", self.route_mode.currentData())
        save_settings(self.data / "routing.json", routing)
        self._state.update(routing=routing)
        self.routing_chosen.emit(routing)

    def routing_failed(self) -> None:
        self._state.update(routing=RoutingChoice())
        self.route_state.setText("Routing is off.")
