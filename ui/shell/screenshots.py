"""`make screenshots`: the window's main states rendered into a folder, to look at one by
one (python -m ui.shell.screenshots OUT). Under Xvfb with the real xcb platform it grabs the
screen, so popups and menus show; offscreen it grabs the window.

It runs in a HOMERACK_HOME of its own (the user's models linked in, none of their
conversations), over a real engine with the starter model. The chat with code and a
table, and the answer about a picture, are sample answers written into the history, since
the 135M starter rarely writes one and cannot see; the first answer shown is the model's
own, and so is the tool round: a real call to mcp-server-time (when it is installed),
forced, approved on the card with its arguments edited, and the model's answer after it."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

SAMPLE = """Here is a function and what it returns:

```python
def mean(values: list[float]) -> float:
    \"\"\"The arithmetic mean; raises on an empty list.\"\"\"
    return sum(values) / len(values)
```

| input | mean |
|---|---|
| `[1, 2, 3]` | 2.0 |
| `[10]` | 10.0 |

> An empty list raises `ZeroDivisionError`: check before calling.

1. Import it.
2. Call `mean([...])`."""


THOUGHT = ("The user asks whether 1,001 is prime. It is odd, so not divisible by 2. "
           "Digit sum 2: not divisible by 3. It does not end in 0 or 5. Try 7: 7 × 143 = "
           "1,001. So it is composite; 143 = 11 × 13, so 1,001 = 7 × 11 × 13.")
THOUGHT_ANSWER = "No. **1,001 = 7 × 11 × 13**, so it has divisors besides 1 and itself."


def _home() -> Path:
    """A private HOMERACK_HOME sharing this user's models."""
    from app.paths import paths

    models = paths().models
    home = Path(tempfile.mkdtemp(prefix="homerack-shots-"))
    (home / "data").mkdir()
    if models.exists():
        (home / "data" / "models").symlink_to(models)
    os.environ["HOMERACK_HOME"] = str(home)
    time_server = Path(sys.executable).parent / "mcp-server-time"
    if time_server.exists():
        (home / "data" / "mcp.json").write_text(json.dumps({"mcpServers": {"time": {
            "command": str(time_server), "args": ["--local-timezone", "UTC"]}}}))
    return home


PICTURE_ANSWER = """A sunset over hills: an orange sun low in a sky that fades from
yellow to violet, above two green slopes."""


def _picture():
    """A drawn sunset, attached as the app attaches a picture."""
    import io

    from PIL import Image, ImageDraw

    from app.attachments import read_image

    image = Image.new("RGB", (640, 400))
    draw = ImageDraw.Draw(image)
    for y in range(400):
        draw.line([(0, y), (640, y)], fill=(250 - y // 3, 200 - y // 3, 80 + y // 4))
    draw.ellipse((380, 170, 500, 290), fill=(255, 120, 40))
    draw.polygon([(0, 400), (0, 300), (250, 240), (640, 330), (640, 400)], fill=(60, 130, 70))
    out = io.BytesIO()
    image.save(out, "PNG")
    return read_image("sunset.png", out.getvalue())


def main(out: str) -> int:
    home = _home()
    try:
        return _shoot_all(out)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _shoot_all(out: str) -> int:
    from PySide6.QtCore import QUrl
    from PySide6.QtGui import QGuiApplication
    from PySide6.QtWidgets import QApplication

    from .launch import create_window

    app = QApplication.instance() or QApplication(sys.argv)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    window = create_window()
    window.resize(1280, 800)
    window.show()
    offscreen = QGuiApplication.platformName() == "offscreen"

    def wait(condition, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError("the window did not get there in time")
            app.processEvents()
            time.sleep(0.02)

    def shoot(name: str) -> None:
        for _ in range(20):
            app.processEvents()
            time.sleep(0.02)
        area = window.frameGeometry()
        image = window.grab() if offscreen else window.screen().grabWindow(
            0, area.x(), area.y(), area.width(), area.height())
        image.save(str(folder / f"{name}.png"))
        print(folder / f"{name}.png", flush=True)

    wait(lambda: window.engine.client is not None and "fit at Q4" in window.chat.welcome.machine.text())
    shoot("1-first-run")
    window.chat.welcome.chips[0].click()
    wait(lambda: not window.chat.sessions.running())
    history, conversation = window.history, window.state.now.conversation
    history.add_message(conversation.id, "user", "Write a mean function, with a table of examples.")
    history.add_message(conversation.id, "assistant", SAMPLE, model="(sample answer)")
    window.open_conversation(conversation.id)
    wait(lambda: all(m.get("kind") for m in window.state.now.models))  # headers read
    shoot("2-chat-with-code-and-table")
    thinking = window.new_conversation()
    history.add_message(thinking.id, "user", "Is 1,001 a prime number?")
    history.add_message(thinking.id, "assistant", THOUGHT_ANSWER, model="(sample answer)",
                        reasoning=THOUGHT, thought_s=12.4)
    window.open_conversation(thinking.id)
    shoot("7-thinking-collapsed")
    answer = history.messages(thinking.id)[-1]
    window.chat.view.anchorClicked.emit(QUrl(f"think:{answer.id}"))
    shoot("7-thinking-open")
    seeing = window.new_conversation()
    history.add_message(seeing.id, "user", "What is in this picture?",
                        attachments=(_picture(),))
    history.add_message(seeing.id, "assistant", PICTURE_ANSWER, model="(sample answer)")
    window.open_conversation(seeing.id)
    shoot("8-picture")
    if (Path(os.environ["HOMERACK_HOME"]) / "data" / "mcp.json").exists():
        _shoot_tools(window, wait, shoot)
    _shoot_documents(window, wait, shoot)
    window.open_conversation(conversation.id)
    if not offscreen:
        window.bar.box.showPopup()
        shoot("3-model-picker")
        window.bar.box.hidePopup()
    if not offscreen and window.bar.adapters.isVisible():  # the user has a fitting adapter
        from PySide6.QtCore import QTimer

        menu = window.bar.adapters.menu()
        QTimer.singleShot(300, lambda: (shoot("3-adapters"), menu.close()))
        menu.exec(window.bar.adapters.mapToGlobal(window.bar.adapters.rect().bottomLeft()))
    for page in ("Memory", "Cluster", "Tools", "Documents", "Settings"):
        window.drawer.open_page(page)
        shoot(f"4-{page.lower()}")
    _shoot_devices(window, wait, shoot)
    _shoot_voice(window, wait, shoot)
    window.drawer.close_page()
    window.set_theme("dark")
    shoot("5-dark")
    window.set_theme("system")
    window.resize(1024, 700)
    window.drawer.open_page("Memory")
    shoot("6-narrow-1024x700")
    window.close()
    return 0


def _shoot_voice(window, wait, shoot) -> None:
    """A recorded question through the microphone's path into the composer, sent, and
    the answer read aloud to the speakers' stand-in; then a hands-free one, sent when its
    speaker paused."""
    from ..chat.sound_devices import RecordedInput, RecordedOutput

    window.drawer.close_page()
    window.open_conversation(window.new_conversation().id)
    voice, client = window.chat.voice, window.engine.client
    voice.microphone = RecordedInput(client.speech("Please tell me a short story about a "
                                                   "dragon who bakes bread.", speed=0.9))
    voice.output = output = RecordedOutput()
    voice.speak.setChecked(True)
    wait(lambda: window.chat.composer.toPlainText())
    shoot("10-voice-speaking")
    voice.speak.setChecked(False)
    wait(lambda: "story" in window.chat.composer.toPlainText().lower())
    window.chat.send(window.chat.composer.toPlainText())
    wait(lambda: not window.chat.sessions.running())
    answer = window.history.messages(window.state.now.conversation.id)[-1]
    window.chat.view.action.emit("speak", str(answer.id))
    wait(lambda: output.played)
    shoot("10-voice-read-aloud")
    conversation = window.state.now.conversation.id
    voice.microphone = RecordedInput(client.speech("And what does the dragon drink with "
                                                   "its bread?", speed=0.9), quiet_s=0.5)
    voice.talk.setChecked(True)  # hands-free: heard, sent and answered aloud, no button
    wait(lambda: len(window.history.messages(conversation)) == 4)
    wait(lambda: not window.chat.sessions.running() and not voice.output.busy())
    shoot("10-voice-talk")
    voice.talk.setChecked(False)


def _shoot_devices(window, wait, shoot) -> None:
    """Shared with the home (127.0.0.2 stands for the LAN here), a device being added."""
    devices = window.devices
    devices.share_where = {"host": "127.0.0.2", "port": 0}
    window.drawer.open_page("Devices")
    devices.share.setChecked(True)
    wait(lambda: "127.0.0.2" in devices.address.text())
    devices.name.setText("Ana's phone")
    devices.add.click()
    wait(lambda: "Code for" in devices.code.text())
    shoot("4-devices")
    devices.share.setChecked(False)
    wait(lambda: "Not shared" in devices.address.text())


def _shoot_tools(window, wait, shoot) -> None:
    """A chat with the time server on: the approval card, then the finished round."""
    from PySide6.QtCore import QUrl

    window.new_conversation()
    window.settings.max_tokens.setValue(64)
    window.state.update(tool_servers=("time",), forced_tool="time/get_current_time")
    wait(lambda: len(window.chat.tools.tools) == 2, 60)
    window.chat.send("What time is it in Tokyo?")
    wait(lambda: window.chat.cards.count() == 1)
    card = window.chat.cards.itemAt(0).widget()
    card.arguments.setPlainText('{\n  "timezone": "Asia/Tokyo"\n}')
    shoot("9-tool-approval")
    card.buttons["once"].click()

    def answered() -> bool:  # the starter calls again: those calls are denied
        if window.chat.cards.count():
            window.chat.cards.itemAt(0).widget().deny.click()
        return not window.chat.sessions.running()
    wait(answered, 180)
    answer = window.history.messages(window.state.now.conversation.id)[-1]
    window.chat.view.anchorClicked.emit(QUrl(f"tools:{answer.id}"))
    shoot("9-tool-round")
    window.state.update(tool_servers=())


def _shoot_documents(window, wait, shoot) -> None:
    """A folder indexing on the Documents page, then an answer that cites its page."""
    from fixtures.documents import pdf_bytes  # a tool of the repository, not of the app

    folder = Path(os.environ["HOMERACK_HOME"]) / "car"
    (folder / "notes").mkdir(parents=True)
    (folder / "manual.pdf").write_bytes(pdf_bytes([
        "Owner's manual\nContents: wheels, tyres, lights",
        "Wheels\nThe wheel bolts are tightened to 120 Nm with a torque wrench.",
        "Tyres\nThe tyre pressure is 2.4 bar when the tyres are cold."]))
    for n in range(300):
        (folder / "notes" / f"trip-{n:03}.md").write_text(
            f"# Trip {n}\nFuel used: {20 + n % 9} litres. " + "The road was long. " * 30)
    window.drawer.open_page("Documents")
    window.documents.add("car", [str(folder)])
    wait(lambda: "indexing:" in _rows(window.documents.rows), 120)
    wait(lambda: _indexed(window.documents.rows) >= 20, 120)
    shoot("9-documents-indexing")
    wait(lambda: "car — ready" in _rows(window.documents.rows), 600)
    window.drawer.close_page()
    window.new_conversation()
    window.settings.max_tokens.setValue(40)
    window.state.update(collections=("car",))
    window.chat.send("How tight are the wheel bolts?")
    wait(lambda: not window.chat.sessions.running(), 180)
    shoot("9-answer-with-sources")
    window.state.update(collections=())


def _rows(layout) -> str:
    return "\n".join(layout.itemAt(i).widget().text() for i in range(layout.count()))


def _indexed(layout) -> int:
    """The files indexed so far, as the page says (all of them once it is ready)."""
    import re

    text = _rows(layout)
    found = re.search(r"indexing: ([\d,]+) of", text)
    return 10**9 if "ready" in text else int(found.group(1).replace(",", "")) if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "build/screenshots"))
