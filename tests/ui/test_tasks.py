"""The app's one background-task helper: a task that outlives the widget it reports to
(a window closed while a request was out) reports to nobody, and nothing raises."""

import threading

from PySide6.QtWidgets import QLabel

from ui.tasks import start_task


def test_a_task_reports_to_its_living_owner(qtbot):
    label = QLabel()
    qtbot.addWidget(label)
    start_task(lambda _t: "done", on_done=label.setText, owner=label)
    qtbot.waitUntil(lambda: label.text() == "done", timeout=5_000)


def test_a_task_outliving_its_owner_reports_to_nobody(qtbot):
    label, release, delivered = QLabel(), threading.Event(), []
    text = label  # the closure holds the wrapper, as the app's callbacks hold widgets

    def later(_task):
        release.wait(5)
        return "late"

    task = start_task(later, on_done=lambda value: delivered.append(text.setText(value)),
                      owner=label)
    finished = threading.Event()
    task.signals.done.connect(lambda _v: finished.set())
    label.deleteLater()
    qtbot.waitUntil(lambda: not _alive(label), timeout=5_000)
    release.set()
    qtbot.waitUntil(finished.is_set, timeout=5_000)  # the result came back to the UI thread
    assert delivered == []  # and the deleted label was not touched (that would raise)


def _alive(widget) -> bool:
    from shiboken6 import isValid
    return isValid(widget)
