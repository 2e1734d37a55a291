"""File ▸ Export and Import: the dialogs around app.transcripts."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog

from app.transcripts import ImportError_, import_file, to_json, to_markdown


def export_dialog(window, everything: bool) -> None:
    history, current = window.history, window.conversation
    chosen = history.conversations() if everything else [current] if current else []
    if not chosen:
        window.show_notice("There is no conversation to export yet.")
        return
    name = "conversations" if everything else chosen[0].title[:40] or "conversation"
    path, kind = QFileDialog.getSaveFileName(window, "Export", name,
                                             "Markdown (*.md);;JSON, to import again (*.json)")
    if path:
        as_json = path.endswith(".json") or kind.startswith("JSON")
        Path(path).write_text((to_json if as_json else to_markdown)(history, chosen),
                              encoding="utf-8")
        window.statusBar().showMessage(f"Exported {len(chosen)} to {path}", 5000)


def import_dialog(window) -> None:
    path, _ = QFileDialog.getOpenFileName(window, "Import conversations", "",
                                          "Homerack export (*.json)")
    if not path:
        return
    try:
        added = import_file(window.history, Path(path))
    except ImportError_ as exc:
        window.show_error(f"Nothing was imported: {exc}")
        return
    window.refresh_conversations()
    window.show_notice(f"Imported {len(added)} conversation{'s' * (len(added) != 1)}.")
