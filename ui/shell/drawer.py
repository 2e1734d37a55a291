"""Memory, Cluster, Downloads and Settings as pages of a drawer beside the chat: one at a
time, the chat stays usable, Esc or × closes it."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QHBoxLayout, QPushButton, QScrollArea, QStackedWidget,
                               QVBoxLayout, QWidget)
from ..safe_text import Label


class Drawer(QWidget):
    changed = Signal(str)  # the page shown ("" when closed)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("drawer")
        self.setMinimumWidth(300)
        self.title = Label(objectName="drawerTitle")
        close = QPushButton("×", accessibleName="Close the panel", flat=True)
        close.setToolTip("Close (Esc)")
        close.clicked.connect(self.close_page)
        top = QHBoxLayout()
        top.addWidget(self.title, 1)
        top.addWidget(close)
        self.stack = QStackedWidget()
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.stack, 1)
        self._pages: dict[str, QWidget] = {}
        self.page = ""
        self.hide()

    def add_page(self, name: str, widget: QWidget) -> None:
        scroll = QScrollArea(widgetResizable=True, frameShape=QScrollArea.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)  # pages fit its width
        scroll.setWidget(widget)
        self._pages[name] = scroll
        self.stack.addWidget(scroll)

    def open_page(self, name: str) -> None:
        self.stack.setCurrentWidget(self._pages[name])
        self.title.setText(name)
        self.page = name
        self.show()
        self.changed.emit(name)

    def toggle(self, name: str) -> None:
        self.close_page() if self.page == name else self.open_page(name)

    def close_page(self) -> None:
        self.page = ""
        self.hide()
        self.changed.emit("")
