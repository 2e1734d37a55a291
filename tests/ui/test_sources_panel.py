"""Settings' "Models elsewhere" (ui/settings/sources_panel.py): each other app's folder
with what it holds, turned off and on, a folder added and removed, and Ollama's API opened
without the token for the next start; the engine is told to look again."""

import json

from fixtures.other_apps import ollama_model, tree_model


def test_sources_are_shown_chosen_and_kept(qtbot, open_window, tmp_path, tiny_model,
                                           monkeypatch, gui_home):
    machine = tmp_path / "machine"
    ollama_model(machine / ".ollama" / "models", tiny_model, "tiny", "1b")
    (machine / ".ollama" / "models" / "manifests" / "registry.ollama.ai" / "library" / "tiny"
     / "bad").write_text("<b>not json</b>")
    tree_model(tmp_path / "shelf", tiny_model, "a/b.gguf", copy=True)
    monkeypatch.setenv("HOME", str(machine))
    monkeypatch.delenv("HOMERACK_MODEL_SOURCES")
    window = open_window(wait=False, engine=False)
    panel = window.settings.sources
    told = []
    panel.changed.connect(lambda: told.append(True))

    def row_texts():
        from PySide6.QtWidgets import QCheckBox, QLabel
        shown = [*panel.findChildren(QCheckBox), *panel.findChildren(QLabel)]
        return [w.text() for w in shown if w.isVisibleTo(panel)]

    qtbot.waitUntil(lambda: "1 model" in row_texts(), timeout=10_000)
    ollama_row = next(box for box in panel.findChildren(type(panel.door))
                      if box.accessibleName() == "Ollama").parentWidget()
    assert str(machine / ".ollama" / "models") in ollama_row.toolTip()
    assert any("cannot use tiny:bad" in t and "not readable JSON" in t for t in row_texts())
    assert "not on this computer" in row_texts()
    ollama = next(box for box in panel.findChildren(type(panel.door))
                  if box.accessibleName() == "Ollama")
    ollama.setChecked(False)
    qtbot.waitUntil(lambda: bool(told), timeout=10_000)
    sources = gui_home / "data" / "sources.json"
    assert json.loads(sources.read_text())["off"] == ["ollama"]
    panel._folder(str(tmp_path / "shelf"), True)
    qtbot.waitUntil(lambda: "shelf: 1 model" in row_texts(), timeout=10_000)
    assert json.loads(sources.read_text())["folders"] == [str(tmp_path / "shelf")]
    panel.door.setChecked(True)
    assert (gui_home / "data" / "ollama-without-token").exists()
    from ui.shell.launch import create_window
    from ui.shell.engine_link import EngineLink

    monkeypatch.setattr(EngineLink, "start", lambda _link: None)
    again = create_window()
    qtbot.addWidget(again)
    assert again.supervisor.serve_args[-2:] == ["--ollama-port", "11434"]
    assert again.settings.sources.door.isChecked()
