"""The menu bar and its shortcuts: every command the window has, reachable from the
keyboard and named for screen readers."""

from __future__ import annotations

from PySide6.QtGui import QAction, QKeySequence


def _action(menu, text: str, slot, shortcut=None) -> QAction:
    action = QAction(text, menu)
    if shortcut:
        action.setShortcut(QKeySequence(shortcut))
    action.triggered.connect(lambda _checked=False: slot())
    menu.addAction(action)
    return action


def build_menus(window, chat, sidebar, models) -> None:
    """The window's menus over its commands and those of its chat page, its sidebar and
    its model control."""
    bar = window.menuBar()
    file = bar.addMenu("&File")
    _action(file, "&New chat", window.new_conversation, QKeySequence.New)
    _action(file, "&Import conversations…", window.import_conversations)
    _action(file, "&Export this conversation…", lambda: window.export_conversations(False),
            "Ctrl+E")
    _action(file, "Export &all conversations…", lambda: window.export_conversations(True))
    file.addSeparator()
    _action(file, "&Get models…", models.open_wizard, "Ctrl+Shift+M")
    file.addSeparator()
    _action(file, "&Quit", window.close, QKeySequence.Quit)

    edit = bar.addMenu("&Edit")
    _action(edit, "&Find conversations", sidebar.focus_search, QKeySequence.Find)
    _action(edit, "&Copy last answer", chat.copy_last_answer, "Ctrl+Shift+C")
    _action(edit, "&Rename conversation", sidebar.rename_current, "F2")
    _action(edit, "&Delete conversation", window.delete_conversation, "Ctrl+Shift+Backspace")

    replies = bar.addMenu("&Chat")
    _action(replies, "&Stop the reply / close the panel", window.escape, "Esc")
    _action(replies, "&Regenerate the answer", chat.regenerate, "Ctrl+R")
    _action(replies, "&Edit the last question", chat.edit, "Ctrl+Shift+E")
    _action(replies, "&Attach files…", chat.bar.attach.click, "Ctrl+Shift+A")

    view = bar.addMenu("&View")
    for page, shortcut in (("Memory", "Ctrl+1"), ("Cluster", "Ctrl+2"),
                           ("Downloads", "Ctrl+3"), ("Tools", "Ctrl+4"),
                           ("Documents", "Ctrl+5"), ("Settings", "Ctrl+,")):
        _action(view, page, lambda p=page: window.toggle_page(p), shortcut)
    view.addSeparator()
    _action(view, "Zoom &in", lambda: window.zoom(1), QKeySequence.ZoomIn)
    _action(view, "Zoom &out", lambda: window.zoom(-1), QKeySequence.ZoomOut)
    _action(view, "&Actual size", lambda: window.zoom(None), "Ctrl+0")
    appearance = view.addMenu("A&ppearance")
    for scheme in ("system", "light", "dark"):
        _action(appearance, scheme.capitalize(), lambda s=scheme: window.set_theme(s))
