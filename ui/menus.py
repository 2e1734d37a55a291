"""The menu bar and its shortcuts: every command the window has, reachable from the
keyboard and named for screen readers."""

from __future__ import annotations

from PySide6.QtGui import QAction, QKeySequence

from .transfer import export_dialog, import_dialog


def _action(menu, text: str, slot, shortcut=None) -> QAction:
    action = QAction(text, menu)
    if shortcut:
        action.setShortcut(QKeySequence(shortcut))
    action.triggered.connect(lambda _checked=False: slot())
    menu.addAction(action)
    return action


def build_menus(window) -> None:
    bar = window.menuBar()
    file = bar.addMenu("&File")
    _action(file, "&New chat", window.new_conversation, QKeySequence.New)
    _action(file, "&Import conversations…", lambda: import_dialog(window))
    _action(file, "&Export this conversation…", lambda: export_dialog(window, False), "Ctrl+E")
    _action(file, "Export &all conversations…", lambda: export_dialog(window, True))
    file.addSeparator()
    _action(file, "&Get models…", window.control.open_wizard, "Ctrl+Shift+M")
    file.addSeparator()
    _action(file, "&Quit", window.close, QKeySequence.Quit)

    edit = bar.addMenu("&Edit")
    _action(edit, "&Find conversations", window.sidebar.focus_search, QKeySequence.Find)
    _action(edit, "&Copy last answer", window.chat.copy_last_answer, "Ctrl+Shift+C")
    _action(edit, "&Rename conversation", window.sidebar.rename_current, "F2")
    _action(edit, "&Delete conversation", window.delete_conversation, "Ctrl+Shift+Backspace")

    chat = bar.addMenu("&Chat")
    _action(chat, "&Stop the reply / close the panel", window.escape, "Esc")
    _action(chat, "&Regenerate the answer", window.chat.regenerate, "Ctrl+R")
    _action(chat, "&Edit the last question", window.chat.edit, "Ctrl+Shift+E")
    _action(chat, "&Attach files…", window.chat.bar.attach.click, "Ctrl+Shift+A")

    view = bar.addMenu("&View")
    for page, shortcut in (("Memory", "Ctrl+1"), ("Cluster", "Ctrl+2"),
                           ("Downloads", "Ctrl+3"), ("Settings", "Ctrl+,")):
        _action(view, page, lambda p=page: window.toggle_page(p), shortcut)
    view.addSeparator()
    _action(view, "Zoom &in", lambda: window.zoom(1), QKeySequence.ZoomIn)
    _action(view, "Zoom &out", lambda: window.zoom(-1), QKeySequence.ZoomOut)
    _action(view, "&Actual size", lambda: window.zoom(None), "Ctrl+0")
    appearance = view.addMenu("A&ppearance")
    for scheme in ("system", "light", "dark"):
        _action(appearance, scheme.capitalize(), lambda s=scheme: window.set_theme(s))
