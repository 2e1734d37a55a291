"""Starts the desktop app: the window plus the engine it supervises."""

from __future__ import annotations

import hashlib
import signal
import sys
from pathlib import Path

from PySide6.QtCore import QLockFile, QTimer
from PySide6.QtNetwork import QLocalServer, QLocalSocket
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication

from app.paths import paths
from app.settings import serve_switches
from app.supervisor import DEFAULT_MODEL, EngineSupervisor

from .main_window import MainWindow
from ..home.devices_page import SHARE_FLAG
from ..resources import icon_path
from ..theme import apply_theme


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
    if (where.data / "home" / SHARE_FLAG).exists() and "--share-home" not in args:
        args.append("--share-home")  # the Devices page's switch, kept
    args += serve_switches(where.data, args)  # Settings' choices
    return MainWindow(where, EngineSupervisor(where.engine_file, args))


def main(serve_args: list[str] | None = None) -> int:
    app = QApplication.instance() or QApplication(sys.argv)
    app.setApplicationName("Homerack")
    app.setDesktopFileName("homerack")
    instance = SingleInstance(paths().data)
    if not instance.first():
        print("Homerack is already open: its window was brought forward", file=sys.stderr)
        return 0
    window = create_window(serve_args)
    instance.on_called(lambda: _bring_forward(window))
    close_on_signals(window)
    window.show()
    return app.exec()


class SingleInstance:
    """One app per data folder: two would start two engines on the same models, downloads
    and caches. A lock file in the folder (Qt's, which a crashed owner does not keep), and
    a local socket through which a second start asks the first to come forward."""

    def __init__(self, data: Path):
        self.lock = QLockFile(str(data / "app.lock"))
        self.lock.setStaleLockTime(0)  # only a dead owner's lock is stale
        self.name = "homerack-" + hashlib.sha256(str(data.resolve()).encode()).hexdigest()[:16]
        self.server: QLocalServer | None = None

    def first(self) -> bool:
        """True for the first app (it now holds the lock); False after asking it to come
        forward."""
        if self.lock.tryLock(200):
            QLocalServer.removeServer(self.name)  # a crashed owner's socket file
            self.server = QLocalServer()
            self.server.setSocketOptions(QLocalServer.SocketOption.UserAccessOption)
            self.server.listen(self.name)
            return True
        caller = QLocalSocket()
        caller.connectToServer(self.name)
        if caller.waitForConnected(2000):
            caller.write(b"forward")
            caller.waitForBytesWritten(2000)
            caller.disconnectFromServer()
        return False

    def on_called(self, callback) -> None:
        def answer():
            while self.server.hasPendingConnections():
                self.server.nextPendingConnection().deleteLater()
                callback()
        self.server.newConnection.connect(answer)


def _bring_forward(window: MainWindow) -> None:
    window.showNormal()
    window.raise_()
    window.activateWindow()


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
