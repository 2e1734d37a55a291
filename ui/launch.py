"""Starts the desktop app: the window plus the engine it supervises."""

from __future__ import annotations

import signal
import sys

from PySide6.QtCore import QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from app.paths import paths
from app.supervisor import DEFAULT_MODEL, EngineSupervisor

from .main_window import MainWindow
from .resources import icon_path
from .theme import apply_theme


def create_window(serve_args: list[str] | None = None) -> MainWindow:
    """The window over its engine; by default (None) the engine `homerack` starts: the
    starter chat model loaded at once."""
    app = QApplication.instance()
    apply_theme(app)
    icon = icon_path()
    if icon.exists():  # every window and dialog, and the task bar
        app.setWindowIcon(QIcon(str(icon)))
    where = paths()
    args = ["--model", DEFAULT_MODEL] if serve_args is None else list(serve_args)
    for flag, option in (("use-workers", "--workers"), ("use-replicas", "--replicas")):
        if (where.data / "cluster" / flag).exists() and option not in args:
            args += [option, "auto"]  # the Cluster panel's choices, kept
    return MainWindow(where, EngineSupervisor(where.engine_file, args))


def main(serve_args: list[str] | None = None) -> int:
    app = QApplication.instance() or QApplication(sys.argv)
    app.setApplicationName("Homerack")
    app.setDesktopFileName("homerack")
    window = create_window(serve_args)
    close_on_signals(window)
    window.show()
    return app.exec()


def close_on_signals(window: MainWindow) -> None:
    """SIGTERM and SIGHUP (a logout, a `kill`) close the window as the user would: the
    reply in progress kept, the engine stopped. Python runs a signal's handler only
    between bytecodes, so a timer lets it run while Qt waits for events."""
    for name in ("SIGTERM", "SIGHUP", "SIGINT"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), lambda *_: QTimer.singleShot(0, window.close))
    ticks = QTimer(window, interval=250)
    ticks.timeout.connect(lambda: None)
    ticks.start()
