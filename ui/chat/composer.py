"""Where a message is written: Enter sends, Shift+Enter starts a new line; files dropped
on it or chosen with Attach join the message (their text, read in app.attachments), and
so do pictures: dropped, chosen, or pasted."""

from __future__ import annotations

from PySide6.QtCore import QBuffer, QByteArray, QIODevice, Qt, Signal
from PySide6.QtGui import QImage
from PySide6.QtWidgets import (QFileDialog, QHBoxLayout, QPlainTextEdit, QPushButton,
                               QVBoxLayout, QWidget)
from ..safe_text import Label

FILE_FILTER = ("Text, code, PDF and images (*.txt *.md *.py *.js *.ts *.json *.csv *.yaml "
               "*.toml *.c *.cpp *.h *.rs *.go *.java *.sh *.sql *.html *.pdf *.png *.jpg "
               "*.jpeg *.webp *.gif *.bmp);;Images (*.png *.jpg *.jpeg *.webp *.gif *.bmp);;"
               "All files (*)")


class Composer(QPlainTextEdit):
    submitted = Signal(str)
    files_dropped = Signal(list)
    image_pasted = Signal(bytes)  # a picture from the clipboard, as PNG

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("composer")
        self.setAccessibleName("Message")
        self.setPlaceholderText("Message (Enter to send, Shift+Enter for a new line)")
        self.setFixedHeight(84)  # three lines; the conversation gets the rest

    def keyPressEvent(self, event) -> None:
        enter = event.key() in (Qt.Key_Return, Qt.Key_Enter)
        if enter and not event.modifiers() & Qt.ShiftModifier:
            text = self.toPlainText().strip()
            if text:
                self.submitted.emit(text)
            return
        super().keyPressEvent(event)

    def canInsertFromMimeData(self, source) -> bool:
        return source.hasImage() or super().canInsertFromMimeData(source)

    def insertFromMimeData(self, source) -> None:
        if source.hasImage():
            image = QImage(source.imageData())
            data = QByteArray()
            buffer = QBuffer(data)
            buffer.open(QIODevice.WriteOnly)
            if not image.isNull() and image.save(buffer, "PNG"):
                self.image_pasted.emit(bytes(data))
            return
        super().insertFromMimeData(source)

    def dragEnterEvent(self, event) -> None:
        if event.mimeData().hasUrls():
            event.acceptProposedAction()
        else:
            super().dragEnterEvent(event)

    def dragMoveEvent(self, event) -> None:
        if event.mimeData().hasUrls():
            event.acceptProposedAction()
        else:
            super().dragMoveEvent(event)

    def dropEvent(self, event) -> None:
        paths = [u.toLocalFile() for u in event.mimeData().urls() if u.isLocalFile()]
        if paths:
            self.files_dropped.emit(paths)
            event.acceptProposedAction()
        else:
            super().dropEvent(event)


class ComposerBar(QWidget):
    """The composer, what is attached, and Attach / Stop / Send."""
    attach_requested = Signal(list)  # file paths
    detach_requested = Signal()

    def __init__(self, parent=None):
        super().__init__(parent)
        self.edit = Composer()
        self.edit.files_dropped.connect(self.attach_requested)
        self.attached = Label(objectName="muted", wordWrap=True)
        self.attached.setAccessibleName("Attached files")
        self.attached.hide()
        self.detach = QPushButton("Remove files", accessibleName="Remove attached files")
        self.detach.clicked.connect(self.detach_requested)
        self.detach.hide()
        self.attach = QPushButton("Attach…", accessibleName="Attach files")
        self.attach.setToolTip("Add text, Markdown, code, PDF files or pictures to the "
                               "message (or drop them on it, or paste a picture)")
        self.attach.clicked.connect(self._choose)
        self.stop = QPushButton("Stop", accessibleName="Stop the reply")
        self.stop.setToolTip("Stop the reply (Esc)")
        self.send = QPushButton("Send", objectName="primary", accessibleName="Send")
        row = QHBoxLayout()
        row.addWidget(self.attached, 1)
        row.addWidget(self.detach)
        buttons = self.buttons = QHBoxLayout()
        buttons.addWidget(self.attach)
        buttons.addStretch(1)
        buttons.addWidget(self.stop)
        buttons.addWidget(self.send)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.edit)
        layout.addLayout(buttons)

    def add_button(self, button: QWidget) -> None:
        """A button beside Attach (the Tools menu)."""
        self.buttons.insertWidget(1, button)

    def show_attached(self, text: str) -> None:
        self.attached.setText(text)
        self.attached.setVisible(bool(text))
        self.detach.setVisible(bool(text))

    def _choose(self) -> None:
        paths, _ = QFileDialog.getOpenFileNames(self, "Attach files", "", FILE_FILTER)
        if paths:
            self.attach_requested.emit(paths)
