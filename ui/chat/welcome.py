"""What a new (or empty) conversation shows: what Homerack is, what this machine can run
(the planner's capacity, from the engine), and suggestions that start a chat."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QGridLayout, QPushButton, QVBoxLayout, QWidget
from ..safe_text import Label

SUGGESTIONS = ("What is the capital of France?", "Explain what a CPU does, simply.",
               "Write a haiku about autumn.", "Give me three tips for learning Python.")


class Welcome(QWidget):
    suggestion = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        heading = Label("Homerack", objectName="heading", alignment=Qt.AlignCenter)
        about = Label("Chat with AI models that run on the machines you own. Nothing you "
                       "write leaves them.\nPick a model at the top, or get more from "
                       "Hugging Face with “Get models…”.",
                       objectName="muted", alignment=Qt.AlignCenter, wordWrap=True)
        self.machine = Label("Looking at this machine…", alignment=Qt.AlignCenter,
                              wordWrap=True)
        self.machine.setAccessibleName("What this machine can run")
        chips = QGridLayout()
        self.chips = []
        for index, text in enumerate(SUGGESTIONS):
            chip = QPushButton(text, objectName="chip", accessibleName=f"Ask: {text}")
            chip.clicked.connect(lambda _c=False, t=text: self.suggestion.emit(t))
            chips.addWidget(chip, index // 2, index % 2)
            self.chips.append(chip)
        layout = QVBoxLayout(self)
        layout.addStretch(2)
        for widget in (heading, about, self.machine):
            layout.addWidget(widget)
        layout.addSpacing(16)
        layout.addLayout(chips)
        layout.addStretch(3)

    def show_machine(self, hardware: dict) -> None:
        capacity = hardware.get("capacity") or {}
        self.machine.setText(capacity.get("summary") or "")
