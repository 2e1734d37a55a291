"""Untrusted text shown inertly. Model answers, imported conversations, Hub cards and
file names, a LAN peer's refusal: none of it may make Qt read a file or reach the
network. Qt renders anything that looks like HTML in a label or tooltip, and a rich-text
view loads every <img src> it meets, on the UI thread: `/dev/zero` is read until memory
runs out, a FIFO blocks the window for ever, `//host/share/a.png` hands a Windows user's
NTLM hash to a stranger. So labels here show plain text, and the views that render
Markdown load no resource but the app's own (qrc:) and inline data (data:)."""

from __future__ import annotations

import html

from PySide6.QtCore import Qt, QUrl
from PySide6.QtWidgets import QLabel, QMessageBox, QTextBrowser, QWidget

ALLOWED_RESOURCES = {"qrc", "data"}


class Label(QLabel):
    """A label that never reads its text as HTML."""

    def __init__(self, text: str = "", parent: QWidget | None = None, **properties):
        super().__init__(parent, **properties)
        self.setTextFormat(Qt.TextFormat.PlainText)
        self.setText(text)


class SafeBrowser(QTextBrowser):
    """A text browser that loads nothing from disk or the network: images in untrusted
    HTML stay empty, links open only through the owner's handler."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setOpenLinks(False)
        self.setOpenExternalLinks(False)

    def loadResource(self, kind: int, url: QUrl):
        if url.scheme() in ALLOWED_RESOURCES:
            return super().loadResource(kind, url)
        return None


def rich_escape(text: str) -> str:
    """`text` as rich text that shows exactly those characters (for a tooltip, which Qt
    otherwise renders as HTML when it looks like HTML)."""
    return f"<p style='white-space:pre-wrap'>{html.escape(text)}</p>"


def ask(parent: QWidget, title: str, text: str) -> bool:
    """A yes/no question whose text (a file's name in it) shows as the characters it is."""
    return QMessageBox.question(parent, title, rich_escape(text)) == QMessageBox.StandardButton.Yes
