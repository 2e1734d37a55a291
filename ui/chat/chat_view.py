"""The conversation, rendered (ui/markdown.py); re-rendered at most every 40 ms while text
streams in, so a fast model cannot flood the UI thread. It follows the bottom while the
reader is there and stays put when they scrolled up to read."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QEvent, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices, QGuiApplication
from PySide6.QtWidgets import QToolTip

from ..markdown import Shown, render
from ..safe_text import SafeBrowser, rich_escape
from ..theme import colors, scheme_changed

ACTIONS = {"edit", "regen", "prev", "next", "speak"}
THINK = "think"  # a link that opens or closes a message's Thinking section
TOOLS = "tools"  # one that opens or closes its tool calls
SOURCE = "source"  # a cited file, opened
# files opened in their app when cited; any other (a script, an HTML page whose scripts
# would run as a file:// page) opens its folder
OPENED = {".pdf", ".docx", ".md", ".markdown", ".txt", ".rst", ".csv"}
ZOOM_STEP = 0.1


class ChatView(SafeBrowser):
    copied = Signal(str)
    action = Signal(str, str)  # ("edit" | "regen" | "prev" | "next" | "speak", message key)
    source_opened = Signal(str)  # the cited file opened

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("chat")
        self.setAccessibleName("Conversation")
        self.anchorClicked.connect(self._on_link)
        self._messages: list[Shown] = []
        self._opened: set[str] = set()  # messages whose Thinking the reader opened
        self._rendered = render([], colors())
        self._base_size = self.font().pointSizeF()
        self.zoom = 0
        self._timer = QTimer(self, singleShot=True, interval=40)
        self._timer.timeout.connect(self._render_now)
        scheme_changed.changed.connect(self._render_now)

    def show_messages(self, messages: list[Shown]) -> None:
        self._messages = list(messages)
        self._render_now(to_bottom=True)

    def set_last(self, message: Shown) -> None:
        """Replace (or add) the last message: the reply being streamed."""
        if self._messages and self._messages[-1].key == message.key:
            self._messages[-1] = message
        else:
            self._messages.append(message)
        if not self._timer.isActive():
            self._timer.start()

    def text_of(self, key: str) -> str:
        """A message's text as Copy takes it."""
        return self._rendered.texts.get(key, "")

    def messages(self) -> list[Shown]:
        return list(self._messages)

    def set_zoom(self, zoom: int) -> None:
        self.zoom = max(-5, min(zoom, 10))
        self._render_now()

    def _render_now(self, to_bottom: bool = False) -> None:
        bar = self.verticalScrollBar()
        at_bottom, kept = bar.value() >= bar.maximum() - 4, bar.value()
        self._rendered = render(self._messages, colors(), frozenset(self._opened))
        font = self.document().defaultFont()
        font.setPointSizeF(self._base_size * (1 + ZOOM_STEP * self.zoom))
        self.document().setDefaultFont(font)
        self.setHtml(self._rendered.html)
        bar.setValue(bar.maximum() if at_bottom or to_bottom else kept)

    def event(self, event) -> bool:
        if event.type() == QEvent.ToolTip:  # an answer's figures, on its model line
            anchor = self.anchorAt(self.viewport().mapFromGlobal(event.globalPos()))
            stats = self._rendered.stats.get(anchor.removeprefix("stats:"), "") \
                if anchor.startswith("stats:") else ""
            if stats:
                QToolTip.showText(event.globalPos(), rich_escape(stats), self)
            else:
                QToolTip.hideText()
            return True
        return super().event(event)

    def _on_link(self, url: QUrl) -> None:
        scheme, value = url.scheme(), url.path()
        codes, texts = self._rendered.codes, self._rendered.texts
        if scheme == "copycode" and value.isdigit() and int(value) < len(codes):
            self._copy(codes[int(value)])
        elif scheme == "copymsg" and value in texts:
            self._copy(texts[value])
        elif scheme == THINK:
            self._opened ^= {value}
            self._render_now()
        elif scheme == TOOLS:
            self._opened ^= {f"tools:{value}"}
            self._render_now()
        elif scheme == SOURCE:
            self._open_source(*value.rpartition(":")[::2])
        elif scheme in ACTIONS:
            self.action.emit(scheme, value)
        elif scheme in ("http", "https", "mailto"):
            QDesktopServices.openUrl(url)

    def _open_source(self, key: str, index: str) -> None:
        """A cited file opened where it reads (a document: in its app, a PDF at its page);
        any other file's folder, never the file itself (a script would run)."""
        message = next((m for m in self._messages if m.key == key), None)
        if message is None or not index.isdigit() or int(index) >= len(message.sources):
            return
        source = message.sources[int(index)]
        path = Path(source["path"])
        if path.suffix.lower() not in OPENED:
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(path.parent)))
            return
        url = QUrl.fromLocalFile(str(path))
        if source.get("page") is not None:
            url.setFragment(f"page={source['page']}")
        QDesktopServices.openUrl(url)
        self.source_opened.emit(str(path))

    def _copy(self, text: str) -> None:
        QGuiApplication.clipboard().setText(text)
        self.copied.emit(text)
