"""The conversations, on the left: search (titles and every message's words), grouped by
date, renamed in place (F2 or double-click), deleted with Delete (the window offers the
undo)."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (QAbstractItemView, QLineEdit, QListWidget,
                               QListWidgetItem, QMenu, QPushButton, QVBoxLayout, QWidget)

from app.history import SavedConversation
from ..safe_text import Label

DAY = 86400
PAGES = {"Memory": "Ctrl+1", "Cluster": "Ctrl+2", "Devices": "Ctrl+6", "Downloads": "Ctrl+3",
         "Tools": "Ctrl+4", "Documents": "Ctrl+5", "Settings": "Ctrl+,"}


def date_group(updated: float, now: float) -> str:
    """The sidebar's heading for a conversation last changed at `updated`."""
    midnight = time.mktime(time.localtime(now)[:3] + (0, 0, 0, 0, 0, -1))
    if updated >= midnight:
        return "Today"
    if updated >= midnight - DAY:
        return "Yesterday"
    if updated >= midnight - 6 * DAY:
        return "Previous 7 days"
    if updated >= midnight - 29 * DAY:
        return "Previous 30 days"
    return "Older"


class Sidebar(QWidget):
    selected = Signal(int)
    renamed = Signal(int, str)
    delete_requested = Signal(int)
    new_requested = Signal()
    search_changed = Signal(str)
    page_toggled = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.setObjectName("sidebar")
        self.new = QPushButton("New chat", objectName="primary", accessibleName="New chat")
        self.new.setToolTip("Start a new conversation (Ctrl+N)")
        self.new.clicked.connect(self.new_requested)
        self.search = QLineEdit(placeholderText="Search conversations (Ctrl+F)",
                                accessibleName="Search conversations", clearButtonEnabled=True)
        self.search.textChanged.connect(self.search_changed)
        self.list = QListWidget(accessibleName="Conversations")
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.ElideRight)
        self.list.setEditTriggers(QAbstractItemView.EditKeyPressed
                                  | QAbstractItemView.DoubleClicked)
        self.list.currentItemChanged.connect(self._on_current)
        self.list.itemChanged.connect(self._on_edited)
        self.list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._menu)
        self.empty = Label(objectName="muted", wordWrap=True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.new)
        layout.addWidget(self.search)
        layout.addWidget(self.list, 1)
        layout.addWidget(self.empty)
        self.pages: dict[str, QPushButton] = {}
        for page, shortcut in PAGES.items():  # the drawer's pages, beside the chat
            button = QPushButton(page, checkable=True, accessibleName=page, flat=True)
            button.setToolTip(f"{page} ({shortcut})")
            button.setStyleSheet("text-align: left; padding-left: 10px;")
            button.clicked.connect(lambda _c=False, p=page: self.page_toggled.emit(p))
            layout.addWidget(button)
            self.pages[page] = button

    def show_page(self, page: str) -> None:
        for name, button in self.pages.items():
            button.setChecked(name == page)

    def show_conversations(self, conversations: list[SavedConversation],
                           current: int | None) -> None:
        self.list.blockSignals(True)
        self.list.clear()
        group, now = None, time.time()
        for conversation in conversations:
            heading = date_group(conversation.updated, now)
            if heading != group:
                group = heading
                header = QListWidgetItem(heading)
                header.setFlags(Qt.NoItemFlags)
                font = header.font()
                font.setBold(True)
                header.setFont(font)
                self.list.addItem(header)
            item = QListWidgetItem(conversation.title)
            item.setData(Qt.UserRole, conversation.id)
            item.setFlags(item.flags() | Qt.ItemIsEditable)
            self.list.addItem(item)
            if conversation.id == current:
                self.list.setCurrentItem(item)
        self.list.blockSignals(False)
        searching = self.search.text().strip()
        self.empty.setText("" if conversations else
                           f"No conversation mentions “{searching}”." if searching else
                           "Your conversations appear here. Write a message to start one.")
        self.empty.setVisible(not conversations)

    def _conversation_items(self) -> list[QListWidgetItem]:
        """The list's conversations, without the date headings."""
        return [self.list.item(i) for i in range(self.list.count())
                if self.list.item(i).data(Qt.UserRole) is not None]

    def titles(self) -> list[str]:
        return [item.text() for item in self._conversation_items()]

    def select_row(self, row: int) -> None:
        """Select the `row`th conversation (headings not counted)."""
        self.list.setCurrentItem(self._conversation_items()[row])

    def focus_search(self) -> None:
        self.search.setFocus()
        self.search.selectAll()

    def rename_current(self) -> None:
        item = self.list.currentItem()
        if item is not None and item.data(Qt.UserRole) is not None:
            self.list.editItem(item)

    def keyPressEvent(self, event) -> None:
        item = self.list.currentItem()
        if event.key() == Qt.Key_Delete and item is not None and item.data(Qt.UserRole):
            self.delete_requested.emit(item.data(Qt.UserRole))
            return
        super().keyPressEvent(event)

    def _on_current(self, item, _previous) -> None:
        if item is not None and item.data(Qt.UserRole) is not None:
            self.selected.emit(item.data(Qt.UserRole))

    def _on_edited(self, item) -> None:
        if item.data(Qt.UserRole) is not None and item.text().strip():
            self.renamed.emit(item.data(Qt.UserRole), item.text().strip())

    def _menu(self, position) -> None:
        item = self.list.itemAt(position)
        if item is None or item.data(Qt.UserRole) is None:
            return
        menu = QMenu(self)
        menu.addAction("Rename", lambda: self.list.editItem(item))
        menu.addAction("Delete", lambda: self.delete_requested.emit(item.data(Qt.UserRole)))
        menu.exec(self.list.viewport().mapToGlobal(position))
