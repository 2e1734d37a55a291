"""One line above the chat: errors and notices, in words, with an optional action
(Retry, Undo). The window shows everything it has to say here."""

from __future__ import annotations

from PySide6.QtWidgets import QFrame, QHBoxLayout, QPushButton

from ..theme import colors
from ..safe_text import Label


class Banner(QFrame):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("banner")
        layout = QHBoxLayout(self)
        self.label = Label(wordWrap=True)
        self.label.setAccessibleName("Message from Homerack")
        self.action = QPushButton()
        self.action.hide()  # until a message offers one (Retry, Undo)
        close = QPushButton("×", flat=True, accessibleName="Dismiss")
        close.clicked.connect(self.hide)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.action)
        layout.addWidget(close)
        self._callback = None
        self.action.clicked.connect(self._act)
        self.hide()

    def show_message(self, text: str, error: bool, action: str | None = None,
                     callback=None) -> None:
        self.setProperty("error", error)
        shade = colors().error_bg if error else colors().notice_bg
        self.setStyleSheet(f"#banner {{ background: {shade}; border-radius: 6px; }}")
        self.label.setText(text)
        self._callback = callback
        self.action.setVisible(bool(action))
        self.action.setText(action or "")
        self.show()

    def _act(self) -> None:
        callback, self._callback = self._callback, None
        self.hide()
        if callback:
            callback()
