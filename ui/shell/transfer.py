"""File ▸ Export and Import: the dialogs around app.transcripts. Each says what it did,
in words the window shows."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QWidget

from app.history import History, SavedConversation
from app.transcripts import ImportError_, import_file, to_json, to_markdown


def export_dialog(parent: QWidget, history: History, current: SavedConversation | None,
                  everything: bool) -> str:
    chosen = history.conversations() if everything else [current] if current else []
    if not chosen:
        return "There is no conversation to export yet."
    name = "conversations" if everything else chosen[0].title[:40] or "conversation"
    path, kind = QFileDialog.getSaveFileName(parent, "Export", name,
                                             "Markdown (*.md);;JSON, to import again (*.json)")
    if not path:
        return ""
    as_json = path.endswith(".json") or kind.startswith("JSON")
    Path(path).write_text((to_json if as_json else to_markdown)(history, chosen),
                          encoding="utf-8")
    return f"Exported {len(chosen)} to {path}"


def import_dialog(parent: QWidget, history: History) -> tuple[str, bool]:
    """What was imported, in words, and whether anything was."""
    path, _ = QFileDialog.getOpenFileName(parent, "Import conversations", "",
                                          "Homerack export (*.json)")
    if not path:
        return "", False
    try:
        added = import_file(history, Path(path))
    except ImportError_ as exc:
        return f"Nothing was imported: {exc}", False
    return f"Imported {len(added)} conversation{'s' * (len(added) != 1)}.", True
