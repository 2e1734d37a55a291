"""`homerack self-test --gui PNG`: the desktop app's first launch, checked. The window
opens, starts its engine, shows the starter model ready to chat, answers a question
typed into it, and saves what it shows; exit status 0 when all of that happened within
the time limit."""

from __future__ import annotations

import sys
import time

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from app.self_test import since_launch
from app.supervisor import DEFAULT_MODEL

from .launch import create_window


def check_window(screenshot: str, prompt: str, timeout: float) -> int:
    app = QApplication.instance() or QApplication(sys.argv)
    window = create_window()  # as `homerack` opens it
    window.show()
    deadline = time.monotonic() + timeout
    state: dict = {"code": 1}

    def finish(code: int, line: str) -> None:
        window.grab().save(screenshot)
        print(line, file=sys.stderr if code else sys.stdout, flush=True)
        state["code"] = code
        timer.stop()
        window.close()
        app.quit()

    def poll() -> None:
        if window.banner.isVisible() and window.banner.property("error"):
            finish(1, f"self-test failed: the window says {window.banner.label.text()!r}")
        elif time.monotonic() > deadline:
            finish(1, f"self-test failed: after {timeout:.0f} s the window shows "
                      f"{window.statusBar().currentMessage()!r}")
        elif window.engine.client is None:
            return  # the engine is starting, or the model loading
        elif "asked" not in state:
            if window.state.now.model != DEFAULT_MODEL:
                finish(1, f"self-test failed: the model box shows "
                          f"{window.bar.box.currentText()!r}, not the starter model")
                return
            print(f"window ready to chat with {DEFAULT_MODEL} {since_launch():.1f} s after "
                  "launch", flush=True)
            state["asked"] = time.monotonic()
            window.chat.send(prompt)
        elif window.chat.current_reply() is None:
            messages = window.history.messages(window.state.now.conversation.id)
            answer = messages[-1].content.strip() if messages[-1].role == "assistant" else ""
            if answer:
                finish(0, f"the window answered {answer[:80]!r} in "
                          f"{time.monotonic() - state['asked']:.1f} s; saved {screenshot}")
            else:
                finish(1, "self-test failed: the window's reply is empty")

    timer = QTimer(interval=200)
    timer.timeout.connect(poll)
    timer.start()
    app.exec()
    return state["code"]
