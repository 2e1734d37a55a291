"""Pictures in the window: attached from a file or pasted, kept beside the message (a
thumbnail in the conversation), sent to a model that sees as image parts, and answered."""

from __future__ import annotations

import pytest
from PIL import Image
from PySide6.QtCore import QMimeData
from PySide6.QtGui import QColor, QImage

from support.models import STARTER


@pytest.fixture
def seeing_home(tmp_path, gui_home, vision_dir, starters_dir, monkeypatch):
    """A home whose models folder holds the starter and a model that sees."""
    root = tmp_path / "seeing-home"
    models = root / "data" / "models"
    models.mkdir(parents=True)
    for path in [*vision_dir.iterdir(), starters_dir / f"{STARTER}.gguf"]:
        (models / path.name).symlink_to(path)
    monkeypatch.setenv("HOMERACK_HOME", str(root))
    return root


def answered(qtbot, window, question: str) -> list[str]:
    """`question` sent with what is attached, four tokens of answer awaited; the errors
    the window showed meanwhile."""
    window.settings.max_tokens.setValue(4)
    errors = []
    window.chat.error.connect(errors.append)
    window.chat.send(question)
    qtbot.waitUntil(lambda: window.chat.current_reply() is None, timeout=180_000)
    return errors


def test_a_picture_is_attached_shown_and_answered_and_twenty_go_on(qtbot, seeing_home,
                                                                    open_window, tmp_path):
    """Two pictures attached (a file and a paste), kept, shown and answered; then, in the
    same window (one engine start), a conversation of twenty pictures the engine has
    never encoded (kept from before a restart, or imported): its next turn answers, its
    oldest pictures left out for the cap on pictures new to the engine (16) and for the
    2,048-token context, and the window says so under the answer."""
    window = open_window(("--model", "smolvlm-256m", "--ctx", "2048"))
    photo = tmp_path / "photo.png"
    Image.new("RGB", (640, 480), (30, 90, 200)).save(photo)
    window.chat.attach([str(photo)])
    qtbot.waitUntil(lambda: bool(window.chat.attachments), timeout=10_000)
    assert "photo.png (picture)" in window.chat.bar.attached.text()
    clip = QMimeData()
    picture = QImage(64, 48, QImage.Format_RGB32)
    picture.fill(QColor("orange"))
    clip.setImageData(picture)
    window.chat.composer.insertFromMimeData(clip)
    qtbot.waitUntil(lambda: len(window.chat.attachments) == 2, timeout=10_000)
    assert answered(qtbot, window, "What is in these pictures?") == []
    messages = window.history.messages(window.state.now.conversation.id)
    assert messages[0].content == "What is in these pictures?"
    assert [(a.kind, a.name) for a in messages[0].attachments] == [
        ("picture", "photo.png"), ("picture", "pasted picture")]
    assert messages[0].attachments[0].data == photo.read_bytes()  # kept as its file
    assert messages[-1].role == "assistant" and messages[-1].status == "complete"
    assert window.chat.view.toHtml().count("<img") >= 2  # the thumbnails
    twenty_pictures_go_on(qtbot, window, tmp_path)


def twenty_pictures_go_on(qtbot, window, tmp_path) -> None:
    """Nineteen pictures kept in a conversation, none encoded by this engine, and a
    twentieth attached: the answer, and what was left out said under it."""
    import io

    from app.attachments import read_image

    def png(n: int) -> bytes:
        out = io.BytesIO()
        Image.new("RGB", (40, 40), (n * 13, 200 - n * 9, 40)).save(out, "PNG")
        return out.getvalue()

    history = window.history
    chat = history.create("Album")
    for n in range(19):
        history.add_message(chat.id, "user", f"Photo {n}",
                            attachments=(read_image(f"p{n}.png", png(n)),))
        history.add_message(chat.id, "assistant", "Seen.", model="smolvlm-256m")
    window.chat.show_conversation(history.get(chat.id))
    last = tmp_path / "p19.png"
    last.write_bytes(png(19))
    window.chat.attach([str(last)])
    qtbot.waitUntil(lambda: bool(window.chat.attachments), timeout=10_000)
    assert answered(qtbot, window, "Which was the reddest?") == []
    answer = history.messages(chat.id)[-1]
    assert answer.role == "assistant" and answer.status == "complete"
    assert "left out: " in answer.detail and "earlier pictures" in answer.detail
    assert "pictures new to the engine" in answer.detail  # the cap, and
    assert "-token context" in answer.detail  # the context: both said
    assert "left out: " in window.chat.view.toPlainText()


def test_the_memory_page_shows_the_projector_and_turns_vision_off(qtbot):
    from ui.models.plan_panel import PlanPanel, describe_device

    panel = PlanPanel()
    qtbot.addWidget(panel)
    asked = []
    panel.preview_requested.connect(lambda *args: asked.append(args))
    panel.show_model("smolvlm-256m")
    device = {"device": "CPU", "budget": 8 << 30, "weights": 100 << 20, "kv": 50 << 20,
              "compute": 10 << 20, "output": 1 << 20, "projector": 65 << 20,
              "mapped_gaps": 0, "total": 226 << 20}
    plan = {"fits": True, "n_ctx": 4096, "kv_type": "f16", "n_gpu_layers": 0,
            "devices": [device], "reasons": [], "moe": False}
    assert not panel.vision.isVisibleTo(panel)
    panel.show_plan({**plan, "asked": asked[-1]})
    assert panel.vision.isVisibleTo(panel) and "projector 65" in describe_device(device)
    panel.vision.setChecked(False)
    qtbot.waitUntil(lambda: asked[-1][4] is False, timeout=5_000)


def test_badges_say_a_model_sees_images():
    from ui.models.download_wizard import _abilities
    from ui.models.model_bar import badges

    assert "sees images" in badges(["tools", "vision"])
    assert "projector is downloaded with it" in _abilities(["vision"])


def test_fetching_pictures_from_the_web_is_a_setting_the_engine_starts_with(
        qtbot, gui_home, monkeypatch):
    from ui.shell.engine_link import EngineLink
    from ui.shell.launch import create_window

    monkeypatch.setattr(EngineLink, "start", lambda _link: None)
    first = create_window()
    qtbot.addWidget(first)
    assert "--allow-image-urls" not in first.supervisor.serve_args  # off by default
    first.settings.image_urls.setChecked(True)
    again = create_window()
    qtbot.addWidget(again)
    assert "--allow-image-urls" in again.supervisor.serve_args
    assert again.settings.image_urls.isChecked()
