"""The tool widgets without an engine: the approval card (its arguments edited, checked,
and denial by closing), the Tools button's count and its warning when the tools crowd
the context, and a tool round in the conversation (collapsed, then opened, inert)."""

from __future__ import annotations

from types import SimpleNamespace

from app.chat_state import ChatState
from app.tool_rounds import Approval, OfferedTool

TOOL = OfferedTool("time", "get_current_time", "Get the time <b>now</b>",
                   {"type": "object"}, "ask", read_only=True, destructive=False,
                   describe="mcp-server-time --local-timezone UTC",
                   offered={"type": "function", "function": {"name": "get_current_time"}})


def _card(qtbot, approval):
    from ui.chat.approval_card import ApprovalCard

    card = ApprovalCard(approval)
    qtbot.addWidget(card)
    decided = []
    card.decided.connect(lambda *args: decided.append(args))
    return card, decided


def test_the_card_shows_every_argument_and_runs_the_edited_ones(qtbot):
    approval = Approval(TOOL, {"timezone": "UTC", "note": "x" * 300}, conversation_id=1)
    card, decided = _card(qtbot, approval)
    assert '"note": "' + "x" * 300 in card.arguments.toPlainText()  # nothing cut
    card.arguments.setPlainText("{not json")
    assert not card.buttons["once"].isEnabled() and card.problem.isVisibleTo(card)
    card.arguments.setPlainText('["a list"]')
    assert not card.buttons["always"].isEnabled()
    card.arguments.setPlainText('{"timezone": "Asia/Tokyo"}')
    card.buttons["chat"].click()
    assert decided == [(approval, "chat", {"timezone": "Asia/Tokyo"})]


def test_closing_the_card_denies(qtbot):
    from PySide6.QtWidgets import QToolButton

    approval = Approval(TOOL, {}, conversation_id=1)
    card, decided = _card(qtbot, approval)
    card.findChild(QToolButton).click()  # ×
    assert decided == [(approval, "deny", None)]


def test_the_tools_button_says_when_tools_crowd_the_context(qtbot, tmp_path):
    from ui.chat.tools_menu import ToolsButton
    from ui.state import WindowState

    state = WindowState(ChatState(health={"n_ctx": 2048}, tool_servers=("time",)))
    button = ToolsButton(state, SimpleNamespace(client=None), tmp_path)
    qtbot.addWidget(button)
    button._show([TOOL, TOOL], 300)
    assert button.text() == "Tools: 2" and "300 tokens" in button.toolTip()
    button._show([TOOL, TOOL], 1024)
    assert button.text() == "Tools: 2 · 50% of the context"
    assert "generic JSON form" in button.toolTip()  # the model's entry lists no "tools"
    state.update(tool_servers=("time", "git"))
    assert (tmp_path / "tool-servers.json").read_text() == '{"servers": "time,git"}'


def test_a_tool_round_is_collapsed_then_opened_and_inert():
    from ui.markdown import Shown, render
    from ui.theme import colors

    call = {"call_id": "c1", "server": "time", "tool": "get_current_time",
            "arguments": {"timezone": "<img src=/dev/zero>"}, "status": "ran",
            "result": "<img src='/dev/zero'> 22:00", "approved": "once", "seconds": 0.01}
    message = Shown("7", "assistant", "It is 22:00.", tools=(call,))
    closed = render([message], colors()).html
    assert "1 tool call: time · get_current_time ✓" in closed and "22:00</" not in closed
    opened = render([message], colors(), frozenset({"tools:7"})).html
    assert "&lt;img src=&#x27;/dev/zero&#x27;&gt; 22:00" in opened and "<img" not in opened
