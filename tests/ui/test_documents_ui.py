"""Documents in the window, over a real engine and the MiniLM starter: a folder added on
the Documents page indexes with its progress shown, the chat's Documents button turns the
collection on, and the answer lists its sources (the manual, page 2), each opening the
file at its page; a question the documents cannot answer says so under the answer."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QUrl

from fixtures.documents import pdf_bytes

pytestmark = pytest.mark.slow


def test_an_answer_from_a_folder_cites_the_page_it_came_from(qtbot, gui_home, open_window,
                                                             tmp_path, monkeypatch):
    from PySide6.QtGui import QDesktopServices

    folder = tmp_path / "car"
    folder.mkdir()
    (folder / "manual.pdf").write_bytes(pdf_bytes([
        "Contents", "Wheels\nThe wheel bolts are tightened to 120 Nm with a torque wrench."]))
    (folder / "install.sh").write_text("echo the wheel bolts script\n")
    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url) or True)
    window = open_window()
    window.settings.max_tokens.setValue(24)
    window.toggle_page("Documents")
    window.documents.add("car", [str(folder)])
    qtbot.waitUntil(lambda: "car — ready · 2 files" in _page_text(window), timeout=120_000)
    window.chat.documents._fill()
    window.chat.documents.menu().actions()[0].setChecked(True)
    assert window.state.now.collections == ("car",)
    assert window.chat.documents.text() == "Documents: car"
    window.chat.send("How tight are the wheel bolts?")
    qtbot.waitUntil(lambda: window.chat.current_reply() is None, timeout=120_000)
    answer = window.history.messages(window.state.now.conversation.id)[-1]
    assert answer.sources[0]["path"].endswith("manual.pdf") and answer.sources[0]["page"] == 2
    assert "Sources: [1] manual.pdf, page 2" in window.chat.view.toPlainText()
    window.chat.view._on_link(QUrl(f"source:{answer.id}:0"))
    assert opened[-1].toLocalFile().endswith("manual.pdf") and opened[-1].fragment() == "page=2"
    script = [i for i, s in enumerate(answer.sources) if s["path"].endswith(".sh")]
    if script:  # a script is never opened: its folder is
        window.chat.view._on_link(QUrl(f"source:{answer.id}:{script[0]}"))
        assert opened[-1].toLocalFile() == str(folder)
    window.chat.send("Who painted the Mona Lisa?")
    qtbot.waitUntil(lambda: window.chat.current_reply() is None, timeout=120_000)
    unrelated = window.history.messages(window.state.now.conversation.id)[-1]
    assert unrelated.sources == [] and "nothing in your documents matched" in unrelated.detail
    # a reply the engine refuses failed, and says so: the engine did not stop
    window.state.update(collections=("no-such-collection",))
    window.chat.send("How tight are the wheel bolts?")
    qtbot.waitUntil(lambda: window.chat.current_reply() is None, timeout=120_000)
    refused = window.history.messages(window.state.now.conversation.id)[-1]
    assert refused.status == "failed"
    assert "the engine stopped" not in window.chat.view.toPlainText()
    assert "no-such-collection" in window.banner.label.text()


def _page_text(window) -> str:
    rows = window.documents.rows
    return "\n".join(rows.itemAt(i).widget().text() for i in range(rows.count()))
