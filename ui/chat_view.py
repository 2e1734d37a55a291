"""The conversation, rendered as Markdown; re-rendered at most every 40 ms while text
streams in, so a fast model cannot flood the UI thread."""

from __future__ import annotations

from PySide6.QtCore import QTimer, QUrl, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QTextBrowser

from .markdown import Shown, render


class ChatView(QTextBrowser):
    copied = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)
        self.anchorClicked.connect(self._on_link)
        self._messages: list[Shown] = []
        self._codes: list[str] = []
        self._texts: dict[str, str] = {}
        self._timer = QTimer(self, singleShot=True, interval=40)
        self._timer.timeout.connect(self._render_now)

    def show_messages(self, messages: list[Shown]) -> None:
        self._messages = list(messages)
        self._render_now()

    def set_last(self, message: Shown) -> None:
        """Replace (or add) the last message: the reply being streamed."""
        if self._messages and self._messages[-1].key == message.key:
            self._messages[-1] = message
        else:
            self._messages.append(message)
        if not self._timer.isActive():
            self._timer.start()

    def messages(self) -> list[Shown]:
        return list(self._messages)

    def _render_now(self) -> None:
        bar = self.verticalScrollBar()
        at_bottom = bar.value() >= bar.maximum() - 4
        markdown, self._codes, self._texts = render(self._messages)
        self.setMarkdown(markdown)
        if at_bottom:
            bar.setValue(bar.maximum())

    def _on_link(self, url: QUrl) -> None:
        scheme, value = url.scheme(), url.path()
        if scheme == "copycode" and value.isdigit() and int(value) < len(self._codes):
            self._copy(self._codes[int(value)])
        elif scheme == "copymsg" and value in self._texts:
            self._copy(self._texts[value])

    def _copy(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copied.emit(text)
