"""The Qt binding keeps Python's reference counts: a method returning void, a setter, a
signal emitted with a bool leave None, True and False as they were. PySide6 6.12.0 dropped
one reference to None on each such call (on Python before 3.12, where None is not
immortal), and the window aborted in a garbage collection a few thousand calls later
("deallocating None": Speak's timers on a machine without a microphone got there in
seconds); pyproject.toml keeps that version out."""

from __future__ import annotations

import sys

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QApplication, QPushButton


class _Sender(QObject):
    flag = Signal(bool)


def test_void_calls_and_bool_signals_keep_the_reference_counts(qapp):
    button = QPushButton("x", checkable=True)
    sender = _Sender()
    sender.flag.connect(lambda on: None)
    calls = (QApplication.processEvents, lambda: button.setEnabled(True),
             lambda: button.setChecked(False), lambda: button.toggled.emit(True),
             lambda: sender.flag.emit(False))
    for call in calls:
        call()  # whatever a first call caches
        before = [sys.getrefcount(x) for x in (None, True, False)]
        for _ in range(200):
            call()
        after = [sys.getrefcount(x) for x in (None, True, False)]
        assert all(abs(a - b) < 50 for a, b in zip(after, before)), (call, before, after)
