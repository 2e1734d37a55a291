"""How a model will use this machine's memory, before it loads: a bar per device
(weights / KV cache / compute / free) from the engine's planner, with the user's
overrides of context, GPU layers and (for a mixture-of-experts model) the layers whose
experts stay in RAM, and their consequence — memory and forecast speed — shown as they
change.

The panel only shows plans and asks for them (signals); the main window runs the
engine calls off the UI thread and hands the answers back with `show_plan`.
"""

from __future__ import annotations

from PySide6.QtCore import QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import (QCheckBox, QFormLayout, QGridLayout, QPushButton,
                               QSlider, QSpinBox, QVBoxLayout, QWidget)
from ..safe_text import Label

MiB = 1 << 20
PARTS = (("weights", "#4a7ebb"), ("kv", "#8e6bbf"), ("compute", "#d08a3b"),
         ("output", "#6aa56a"), ("projector", "#c0608a"))


class MemoryBar(QWidget):
    """One device: its parts laid end to end against its budget; red past the budget."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setMinimumSize(160, 16)
        self.device: dict = {}

    def set_device(self, device: dict) -> None:
        self.device = device
        self.update()

    def paintEvent(self, _event) -> None:
        painter = QPainter(self)
        rect = QRectF(self.rect()).adjusted(0, 1, -1, -1)
        painter.fillRect(rect, QColor("#e6e6e6"))  # free
        scale = max(self.device.get("budget", 0), self.device.get("total", 0), 1)
        x = rect.left()
        for key, color in PARTS:
            width = rect.width() * self.device.get(key, 0) / scale
            painter.fillRect(QRectF(x, rect.top(), width, rect.height()), QColor(color))
            x += width
        if self.device.get("total", 0) > self.device.get("budget", 0):
            painter.setPen(QColor("#c0392b"))
            painter.drawRect(rect)


def describe_device(device: dict) -> str:
    free = device["budget"] - device["total"]
    parts = ", ".join(f"{key} {device[key] / MiB:,.{1 if device[key] < 10 * MiB else 0}f}"
                      for key, _ in PARTS if device.get(key))
    state = f"{free / MiB:,.0f} MiB free" if free >= 0 else f"{-free / MiB:,.0f} MiB too much"
    return f"{device['device']}: {parts or 'unused'} MiB · {state}"


class PlanPanel(QWidget):
    # model, n_ctx | None, gpu layers | None, layers with experts in RAM | None,
    # vision (None: as planned; False: without the projector)
    preview_requested = Signal(str, object, object, object, object)
    load_requested = Signal(str, object, object, object, object)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.model = ""
        self.title = Label("Choose a model at the top to see what loading it takes.")
        self.title.setWordWrap(True)
        self.context = QSpinBox(minimum=0, maximum=1 << 20, singleStep=1024,
                                specialValueText="planned")
        self.layers = QSpinBox(minimum=-1, maximum=999, specialValueText="planned")
        self.layers.setValue(-1)
        self.experts = QSlider(Qt.Horizontal, minimum=0, maximum=0)
        self.experts.setObjectName("plan-experts")
        self.experts_label = Label()
        self._experts_chosen = False  # until the user moves it, it shows the planner's
        self.experts.valueChanged.connect(self._choose_experts)
        self.vision = QCheckBox("See images (load the vision projector)", checked=True)
        self.vision.setAccessibleName("See images")
        self.vision.setToolTip("Off: the projector is not loaded and its memory goes to the "
                               "model; pictures are then refused")
        self.vision.toggled.connect(lambda _on: self._debounce.start())
        self.vision.hide()
        self.bars = QGridLayout()
        self.reasons = Label()
        self.reasons.setWordWrap(True)
        self.load_button = QPushButton("Load with this plan")
        self.load_button.clicked.connect(
            lambda: self.load_requested.emit(self.model, *self.overrides()))
        self._debounce = QTimer(self, singleShot=True, interval=150)
        self._debounce.timeout.connect(
            lambda: self.preview_requested.emit(self.model, *self.overrides()))
        for box in (self.context, self.layers):
            box.valueChanged.connect(lambda _value: self._debounce.start())
        form = QFormLayout()
        form.addRow(Label("Context (tokens)"), self.context)
        form.addRow(Label("GPU layers"), self.layers)
        form.addRow(self.experts_label, self.experts)
        form.addRow(self.vision)
        self._experts_row = (self.experts_label, self.experts)
        self._show_experts_row(False)
        for widget, name in ((self.context, "Context in tokens"), (self.layers, "GPU layers"),
                             (self.experts, "Layers with their experts in RAM")):
            widget.setAccessibleName(name)
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addLayout(self.bars)
        layout.addWidget(self.reasons)
        layout.addLayout(form)
        layout.addWidget(self.load_button, 0, Qt.AlignRight)
        layout.addStretch(1)

    def overrides(self) -> tuple[int | None, int | None, int | None, bool | None]:
        return (self.context.value() or None,
                self.layers.value() if self.layers.value() >= 0 else None,
                self.experts.value() if self._experts_chosen else None,
                None if self.vision.isChecked() else False)

    def show_model(self, model: str) -> None:
        """Plan `model` afresh, with the planner's own choices."""
        self.model = model
        self._experts_chosen = False
        for box, value in ((self.context, 0), (self.layers, -1), (self.experts, 0)):
            box.blockSignals(True)
            box.setValue(value)
            box.blockSignals(False)
        self.vision.blockSignals(True)
        self.vision.setChecked(True)
        self.vision.hide()
        self.vision.blockSignals(False)
        self.title.setText(f"Planning {model}…")
        self.preview_requested.emit(model, None, None, None, None)

    def _choose_experts(self, _value: int) -> None:
        self._experts_chosen = True
        self._label_experts(self.experts.value(), chosen=True)
        self._debounce.start()

    def _label_experts(self, layers: int, chosen: bool) -> None:
        where = "none" if not layers else f"layers 0–{layers - 1}"
        self.experts_label.setText(f"Experts in RAM: {where}"
                                   + ("" if chosen else " (planned)"))

    def _show_experts_row(self, shown: bool) -> None:
        for widget in self._experts_row:
            widget.setVisible(shown)

    def show_plan(self, plan: dict) -> None:
        """A plan the engine answered for `plan["asked"]` = (model, n_ctx, gpu layers,
        layers with experts in RAM)."""
        if tuple(plan["asked"]) != (self.model, *self.overrides()):
            return  # an answer to an older question: a newer one is on its way
        verdict = "fits" if plan["fits"] else "does not fit"
        experts = (f", experts of {plan['cpu_moe_layers']} layers in RAM"
                   if plan.get("cpu_moe_layers") else "")
        speed = plan.get("forecast") or {}
        about = f" · about {speed['decode_tokens_per_s']:,.1f} tok/s" if speed else ""
        if speed.get("image_encode_s"):
            about += f" · about {speed['image_encode_s']:,.1f} s to see a picture"
        self.title.setText(
            f"{self.model} {verdict}: {plan['n_ctx']:,} tokens of context, "
            f"{plan['kv_type']} KV cache, {plan['n_gpu_layers']} layers on GPU{experts}{about}")
        self._show_experts_row(bool(plan.get("moe")))
        if plan.get("moe") and not self._experts_chosen:
            self.experts.blockSignals(True)
            self.experts.setMaximum(plan["n_layers"])
            self.experts.setValue(plan["cpu_moe_layers"])
            self.experts.blockSignals(False)
            self._label_experts(plan["cpu_moe_layers"], chosen=False)
        self._show_bars(plan["devices"])
        if any(d.get("projector") for d in plan["devices"]):
            self.vision.show()  # stays, unchecked, once the user turns it off
        self.reasons.setText("\n".join(f"• {r}" for r in plan["reasons"]))
        self.load_button.setEnabled(plan["fits"])

    def _show_bars(self, devices: list[dict]) -> None:
        while self.bars.count():
            self.bars.takeAt(0).widget().deleteLater()
        for row, device in enumerate(devices):
            bar = MemoryBar()
            bar.set_device(device)
            label = Label(describe_device(device), wordWrap=True)
            self.bars.addWidget(label, row * 2, 0)
            self.bars.addWidget(bar, row * 2 + 1, 0)
