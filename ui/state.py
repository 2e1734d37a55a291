"""The window's state (app/chat_state.py's ChatState) held in one object the pages
observe: `update` replaces it and `changed` names the fields that changed. Pages read
`state.now`; none keeps its own copy of the conversation, the model or the settings."""

from __future__ import annotations

from dataclasses import fields, replace

from PySide6.QtCore import QObject, Signal

from app.chat_state import ChatState


class WindowState(QObject):
    changed = Signal(frozenset)  # the names of ChatState's fields that changed

    def __init__(self, now: ChatState = ChatState(), parent=None):
        super().__init__(parent)
        self.now = now

    def update(self, **changes) -> None:
        before, after = self.now, replace(self.now, **changes)
        names = frozenset(f.name for f in fields(ChatState)
                          if getattr(before, f.name) != getattr(after, f.name))
        self.now = after
        if names:
            self.changed.emit(names)
