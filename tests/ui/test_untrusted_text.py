"""Untrusted text is inert in the window (ui/safe_text.py): a Markdown image in an answer,
an imported conversation or a Hub card never makes Qt read its source (`/dev/zero` ended
the app, a FIFO hung it), and no label renders what it shows as HTML."""

import errno
import os
import threading
import time

import pytest
from PySide6.QtWidgets import QLabel

from ui.chat.chat_view import ChatView
from ui.models.download_wizard import ModelWizard
from ui.markdown import Shown, document, render
from ui.theme import LIGHT


class Tripwire:
    """A FIFO that notices when anything opens it for reading: the read Qt would block on
    for ever is seen, and released, instead of hanging the test."""

    def __init__(self, folder):
        self.path = folder / "image.png"
        os.mkfifo(self.path)
        self.opened = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self):
        while not self._stop.is_set():
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
            except OSError as error:  # ENXIO: no reader yet
                assert error.errno == errno.ENXIO
                time.sleep(0.005)
                continue
            self.opened.set()
            os.close(fd)  # the reader sees the end of the file
            return

    def close(self):
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def tripwire(tmp_path):
    wire = Tripwire(tmp_path)
    yield wire
    wire.close()


def test_a_markdown_image_is_its_alt_text_and_a_web_link_never_an_img():
    html = render([Shown("1", "assistant", "![zero](/dev/zero) ![cat](https://example.org/c.png) "
                                           "![](//host/share/a.png)")], LIGHT).html
    assert "<img" not in html
    assert "[image: zero]" in html and '[image: <a href="https://example.org/c.png">cat</a>]' in html
    assert "[image: image]" in html and "//host/share" not in html
    card = document("# A model\n\n![logo](/dev/zero)\n\n<img src=\"/dev/zero\">")
    assert "<img" not in card and "<h1>A model</h1>" in card


def test_only_an_attached_picture_is_drawn_never_one_in_a_text_or_a_files_name():
    import base64
    import io

    from PIL import Image

    from app.attachments import Attachment, read_image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 0, 0)).save(out, "PNG")
    picture = read_image("red.png", out.getvalue())
    inline = f"![red](data:image/png;base64,{base64.b64encode(out.getvalue()).decode()})"
    named = Attachment.file(f"notes {inline}.md", "hello")  # an imported file's name
    html = render([Shown("1", "user", f"look {inline}", attached=(
        (picture.as_markdown(), True), (named.as_markdown(), False))),
        Shown("2", "assistant", inline)], LIGHT).html
    assert html.count("<img") == 1 and picture.data_url in html  # the attached picture
    assert html.count("[image: red]") == 3  # the question's, the name's, the answer's


def test_the_chat_view_reads_no_image_a_message_names(qtbot, tripwire):
    view = ChatView()
    qtbot.addWidget(view)
    view.show_messages([Shown("1", "assistant", f"![x]({tripwire.path})"),
                        Shown("2", "user", f'<img src="{tripwire.path}">')])
    assert "[image: x]" in view.toPlainText() and "<img" in view.toPlainText()
    view.setHtml(f'<p>raw</p><img src="{tripwire.path}"><img src="file://{tripwire.path}">')
    view.repaint()
    qtbot.wait(100)
    assert not tripwire.opened.is_set(), "the view opened the image's file"


def test_a_labels_text_is_never_read_as_html(qtbot, open_window, tripwire):
    window = open_window(wait=False, engine=False)
    window.banner.show_message(f'<img src="{tripwire.path}">refused', error=True)
    wizard = ModelWizard(None, window.watcher, window)  # its pages' labels show Hub text
    labels = window.findChildren(QLabel)
    assert wizard.files_page.status in labels
    assert len(labels) > 10
    rich = [label.objectName() or label.text() for label in labels
            if label.textFormat() != label.textFormat().PlainText]
    assert not rich, f"labels that may render HTML: {rich}"
    qtbot.wait(100)
    assert not tripwire.opened.is_set()
    assert window.banner.label.text().startswith("<img")


@pytest.mark.parametrize("name, opens", [
    ("page.html", "folder"), ("page.htm", "folder"), ("run.sh", "folder"),
    ("manual.pdf", "file"), ("notes.md", "file")])
def test_a_cited_file_opens_where_nothing_in_it_runs(qtbot, monkeypatch, tmp_path, name, opens):
    """A cited HTML page would run its scripts as a file:// page: its folder opens, as a
    script's does; a document opens in its app."""
    from PySide6.QtCore import QUrl
    from PySide6.QtGui import QDesktopServices

    from ui.chat.chat_view import SOURCE

    opened = []
    monkeypatch.setattr(QDesktopServices, "openUrl", lambda url: opened.append(url) or True)
    view = ChatView()
    qtbot.addWidget(view)
    cited = tmp_path / "docs" / name
    view.show_messages([Shown("m1", "assistant", "See the source.",
                              sources=({"path": str(cited), "page": None},))])
    view._on_link(QUrl(f"{SOURCE}:m1:0"))
    target = cited.parent if opens == "folder" else cited
    assert [url.toLocalFile() for url in opened] == [str(target)]
