"""Tools in the window, over a real engine and mcp-server-time: the Tools button turns the
server on and says what its tools cost in tokens; a forced call (the starter is too small
to choose one) shows the approval card with the full arguments, which the user edits to
Tokyo before running it once; the answer keeps the call, collapsed; a call the user
denies goes back to the model as denied; "always" is kept and revoked on the Tools page."""

from __future__ import annotations

import json

import pytest

from support.mcp_servers import time_server

pytestmark = pytest.mark.slow


@pytest.fixture
def time_home(gui_home):
    (gui_home / "data" / "mcp.json").write_text(json.dumps({"mcpServers": {
        "time": time_server()}}))
    return gui_home


def _card(qtbot, window):
    qtbot.waitUntil(lambda: window.chat.cards.count() == 1, timeout=120_000)
    return window.chat.cards.itemAt(0).widget()


def _deny_the_rest(qtbot, window):
    """The starter calls again after a result (it is too small to stop): each later card
    is denied, which ends the tools for this reply; then the reply ends."""
    def ended() -> bool:
        if window.chat.cards.count():
            window.chat.cards.itemAt(0).widget().deny.click()
        return window.chat.current_reply() is None
    qtbot.waitUntil(ended, timeout=180_000)


def _enable_time(qtbot, window):
    window.chat.tools.refresh()
    qtbot.waitUntil(lambda: bool(window.chat.tools.servers), timeout=30_000)
    window.state.update(tool_servers=("time",))
    qtbot.waitUntil(lambda: len(window.chat.tools.tools) == 2, timeout=30_000)
    assert window.chat.tools.text() == "Tools: 2"
    assert "tokens with every request" in window.chat.tools.toolTip()


def _ask_forced(qtbot, open_window, question: str):
    """A window with the time server on, asked `question` with get_current_time forced
    (the starter is too small to choose it): the window and the first approval card."""
    window = open_window()
    window.settings.max_tokens.setValue(64)
    _enable_time(qtbot, window)
    window.state.update(forced_tool="time/get_current_time")
    window.chat.send(question)
    return window, _card(qtbot, window)


def test_an_approved_call_answers_what_time_it_is_in_tokyo(qtbot, time_home, open_window):
    window, card = _ask_forced(qtbot, open_window, "What time is it in Tokyo?")
    shown = json.loads(card.arguments.toPlainText())
    assert set(shown) == {"timezone"}  # the model's own arguments, all of them
    assert "reads only" in card.findChildren(type(card.problem))[1].text()
    card.arguments.setPlainText('{"timezone": "Asia/Tokyo"}')
    card.buttons["once"].click()
    _deny_the_rest(qtbot, window)
    answer = window.history.messages(window.state.now.conversation.id)[-1]
    call = answer.tools[0]
    assert (call["server"], call["tool"], call["status"]) == ("time", "get_current_time", "ran")
    assert call["arguments"] == {"timezone": "Asia/Tokyo"} and "+09:00" in call["result"]
    assert call["approved"] == "once" and answer.status == "complete"
    assert all(later["status"] == "denied" for later in answer.tools[1:])
    assert "time · get_current_time ✓" in window.chat.view.toPlainText()
    window.chat.view._on_link(_url("tools:" + str(answer.id)))
    assert "Asia/Tokyo" in window.chat.view.toPlainText()  # opened: arguments and result
    sent = window.chat.sessions.request(window.state.now.conversation)
    assert any(m["role"] == "tool" and "+09:00" in m["content"] for m in sent)


def test_a_denied_call_is_reported_to_the_model(qtbot, time_home, open_window):
    window, card = _ask_forced(qtbot, open_window, "What time is it?")
    card.deny.click()
    qtbot.waitUntil(lambda: window.chat.current_reply() is None, timeout=180_000)
    assert window.chat.cards.count() == 0
    answer = window.history.messages(window.state.now.conversation.id)[-1]
    assert len(answer.tools) == 1 and answer.tools[0]["status"] == "denied"  # no more asks
    assert answer.tools[0]["result"] == "The user denied this call."
    assert window.engine.client.mcp_servers()["approvals"] == []  # nothing kept
    sent = window.chat.sessions.request(window.state.now.conversation)
    assert {"role": "tool", "tool_call_id": answer.tools[0]["call_id"],
            "content": "The user denied this call."} in sent


def test_always_is_kept_and_revoked_on_the_tools_page(qtbot, time_home, open_window):
    window, card = _ask_forced(qtbot, open_window, "Time?")
    card.buttons["always"].click()
    qtbot.waitUntil(lambda: window.chat.current_reply() is None, timeout=180_000)
    assert window.chat.cards.count() == 0  # the starter called again: no card, allowed
    answer = window.history.messages(window.state.now.conversation.id)[-1]
    assert answer.tools[0]["approved"] == "always"
    assert {call["status"] for call in answer.tools} == {"ran"}
    window.chat.tools.count()  # the policy is read again: allowed for good now
    qtbot.waitUntil(lambda: bool(window.chat.tools.tools) and
                    window.chat.tools.tools[0].policy == "allow", timeout=30_000)
    window.toggle_page("Tools")
    panel = window.tools
    qtbot.waitUntil(lambda: panel.approvals.count() == 1 and
                    panel.approvals.itemAt(0).layout() is not None, timeout=30_000)
    row = panel.approvals.itemAt(0).layout()
    assert "get_current_time: always allowed" in row.itemAt(0).widget().text()
    row.itemAt(1).widget().click()  # Revoke
    qtbot.waitUntil(lambda: window.engine.client.mcp_servers()["approvals"] == [],
                    timeout=30_000)


def test_each_tool_gets_a_policy_on_the_tools_page(qtbot, time_home, open_window):
    window = open_window()
    window.toggle_page("Tools")
    panel = window.tools
    qtbot.waitUntil(lambda: "time" in panel.tool_rows, timeout=30_000)
    panel.show_tools("time")
    rows = panel.tool_rows["time"]
    qtbot.waitUntil(lambda: rows.count() == 2, timeout=30_000)
    convert = rows.itemAt(1).layout()
    assert "convert_time (reads only)" in convert.itemAt(0).widget().text()
    convert.itemAt(1).widget().setCurrentText("deny")
    qtbot.waitUntil(lambda: window.engine.client.mcp_servers()["approvals"] != [],
                    timeout=30_000)
    decision = window.engine.client.mcp_servers()["approvals"][0]
    assert (decision["tool"], decision["decision"]) == ("convert_time", "deny")
    qtbot.waitUntil(lambda: panel.approvals.itemAt(0).layout() is not None, timeout=30_000)
    assert rows.count() == 2  # the tools shown stay open
    window.state.update(tool_servers=("time",))
    qtbot.waitUntil(lambda: len(window.chat.tools.tools) == 1, timeout=30_000)  # not offered
    panel.read_only.setChecked(True)  # read-only tools now run unasked
    listed = window.engine.client.mcp_tools("time")["tools"]
    assert {t["name"]: t["policy"] for t in listed} == {"get_current_time": "allow",
                                                        "convert_time": "deny"}


def _url(text: str):
    from PySide6.QtCore import QUrl

    return QUrl(text)
