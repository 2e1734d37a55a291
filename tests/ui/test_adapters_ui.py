"""A conversation's LoRA adapters in the window: chosen from the model bar, kept with the
conversation, sent with each reply, and named on the message that used them."""

import pytest

from support.models import ADAPTER, GEMMA, PARIS_QUESTION, STARTER

pytestmark = pytest.mark.slow


@pytest.fixture
def window(qtbot, server, home, monkeypatch):
    """A window attached to the shared engine (its models folder holds the adapter)."""
    from ui.shell.launch import create_window

    monkeypatch.setenv("HOMERACK_HOME", str(home / "server"))
    window = create_window(["--model", STARTER])
    qtbot.addWidget(window)
    window.show()
    qtbot.waitUntil(lambda: window.engine.client is not None, timeout=90_000)
    qtbot.waitUntil(lambda: window.bar.adapters.isVisible(), timeout=60_000)
    yield window
    window.close()


def _scale_action(window, adapter: str, label: str):
    menu = next(a.menu() for a in window.bar.adapters.menu().actions() if a.text() == adapter)
    return next(a for a in menu.actions() if a.text() == label)


def test_a_conversations_adapter_answers_and_is_named_on_the_message(qtbot, window):
    assert window.bar.adapters.text() == "No adapter"
    names = [a.text() for a in window.bar.adapters.menu().actions()]
    assert names == [ADAPTER]  # Gemma's adapter does not fit the starter
    _scale_action(window, ADAPTER, "×0.5").trigger()
    conversation = window.state.now.conversation
    assert conversation.adapters == ((ADAPTER, 0.5),)
    assert window.bar.adapters.text() == f"Adapter: {ADAPTER} ×0.5"
    assert window.state.now.request_options()["lora"] == [
        {"id": ADAPTER, "scale": 0.5}]
    window.chat.send(PARIS_QUESTION)
    qtbot.waitUntil(lambda: not window.chat.sessions.running(), timeout=90_000)
    answer = window.history.messages(conversation.id)[-1]
    assert answer.role == "assistant" and answer.status == "complete", answer
    assert answer.model == STARTER and answer.detail == f"adapter {ADAPTER} ×0.5"
    assert f"adapter {ADAPTER} ×0.5" in window.chat.view.toPlainText()
    # another conversation starts without it; coming back brings it back
    window.new_conversation()
    assert window.bar.adapters.text() == "No adapter"
    assert "lora" not in window.state.now.request_options()
    window.open_conversation(conversation.id)
    assert window.bar.adapters.text() == f"Adapter: {ADAPTER} ×0.5"
    _scale_action(window, ADAPTER, "Off").trigger()
    assert window.state.now.conversation.adapters == ()
    # a model the adapter does not fit hides the button
    window.bar.box.setCurrentIndex(window.bar.box.findData(GEMMA))
    window.control.choose(GEMMA)
    assert [a.text() for a in window.bar.adapters.menu().actions()] == ["gemma-style"]
