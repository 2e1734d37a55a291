"""Settings → Tools: the MCP servers in mcp.json with their state and their logs, the file
opened for editing, another app's servers imported (Claude Desktop, Cursor, LM Studio),
the decisions the user made for good (each revocable), and whether requests may name a
server by address. Reading the engine's list runs off the UI thread."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QCheckBox, QFileDialog, QHBoxLayout, QMenu, QPushButton,
                               QToolButton, QVBoxLayout, QWidget)

from app.paths import Paths
from app.settings import REQUEST_MCP, switch, switched_on
from app.tool_config import config_file, found_elsewhere, import_from, keyring_note

from ..safe_text import Label
from ..tasks import start_task

DECISIONS = {"allow": "always allowed", "deny": "never allowed", "ask": "asks"}


class ToolsPanel(QWidget):
    error = Signal(str)
    notice = Signal(str)

    def __init__(self, where: Paths, engine, parent=None):
        super().__init__(parent)
        self.where, self.engine = where, engine
        self.servers = QVBoxLayout()
        self.approvals = QVBoxLayout()
        edit = QPushButton("Open mcp.json", accessibleName="Open the MCP servers file")
        edit.clicked.connect(self._open_file)
        self.importing = QToolButton(text="Import from another app…",
                                     accessibleName="Import MCP servers")
        self.importing.setPopupMode(QToolButton.InstantPopup)
        self.importing.setMenu(QMenu(self))
        self.importing.menu().aboutToShow.connect(self._fill_imports)
        reload = QPushButton("Refresh", accessibleName="Read the tool servers again")
        reload.clicked.connect(self.refresh)
        self.request_servers = QCheckBox("Let requests name tool servers by address",
                                         accessibleName="Allow request MCP servers")
        self.request_servers.setChecked(switched_on(where.data, REQUEST_MCP))
        self.request_servers.toggled.connect(lambda on: switch(where.data, REQUEST_MCP, on))
        buttons = QHBoxLayout()
        for button in (edit, reload):
            buttons.addWidget(button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(Label(
            "Programs and services the model may use (MCP servers, in mcp.json as Claude "
            "Desktop and Cursor write it). Turn them on for chats with the composer's Tools "
            "button; each call shows you its arguments and asks first, unless you allow it "
            f"for good. {keyring_note()}.", objectName="muted", wordWrap=True))
        layout.addLayout(self.servers)
        layout.addLayout(buttons)
        layout.addWidget(self.importing)
        layout.addWidget(Label("Your decisions", objectName="muted"))
        layout.addLayout(self.approvals)
        layout.addWidget(self.request_servers)
        layout.addWidget(Label(
            "Off, API requests may use only the servers above, by name; on, also any server "
            "a request names by URL (never a program). Applies the next time Homerack "
            "starts.", objectName="muted", wordWrap=True))
        layout.addStretch(1)

    def refresh(self) -> None:
        client = self.engine.client
        if client is not None:
            start_task(lambda _t: client.mcp_servers(), on_done=self._show,
                       on_error=lambda e: self.error.emit(f"The tool servers: {e}"), owner=self)

    def _show(self, listing: dict) -> None:
        _clear(self.servers)
        _clear(self.approvals)
        for server in listing["servers"]:
            state = server["state"] + (f", {server['tools']} tools" if server["tools"] else "")
            if server["error"]:
                state += f": {server['error']}"
            row = QHBoxLayout()
            line = Label(f"{server['label']} ({server['kind']}) — {_short(server)}"
                         f" · {'off' if server['disabled'] else state}", wordWrap=True)
            line.setToolTip(server["describe"])
            row.addWidget(line, 1)
            if server["kind"] == "stdio":
                log = QPushButton("Log", accessibleName=f"Open the log of {server['label']}")
                log.clicked.connect(lambda _=False, s=server["label"]: self._open_log(s))
                row.addWidget(log)
            self.servers.addLayout(row)
        for label, problem in listing["problems"].items():
            self.servers.addWidget(Label(f"{label}: {problem}", objectName="muted",
                                         wordWrap=True))
        if not listing["servers"] and not listing["problems"]:
            self.servers.addWidget(Label("No tool servers yet.", objectName="muted"))
        for decision in listing["approvals"]:
            row = QHBoxLayout()
            row.addWidget(Label(f"{decision['server']} · {decision['tool']}: "
                                f"{DECISIONS[decision['decision']]}", wordWrap=True), 1)
            revoke = QPushButton("Revoke", accessibleName=f"Revoke {decision['tool']}")
            revoke.clicked.connect(lambda _=False, d=decision: self._revoke(d))
            row.addWidget(revoke)
            self.approvals.addLayout(row)
        if not listing["approvals"]:
            self.approvals.addWidget(Label("None: every tool asks.", objectName="muted"))

    def _revoke(self, decision: dict) -> None:
        client = self.engine.client
        if client is not None:
            start_task(lambda _t: client.revoke_tool(decision["identity"], decision["tool"]),
                       on_done=lambda _r: self.refresh(),
                       on_error=lambda e: self.error.emit(f"Revoking failed: {e}"), owner=self)

    def _open_file(self) -> None:
        try:
            path = config_file(self.where)
        except OSError as exc:
            self.error.emit(f"mcp.json cannot be made: {exc}")
            return
        QDesktopServices.openUrl(QUrl.fromLocalFile(str(path)))

    def _open_log(self, label: str) -> None:
        path = self.where.data / "logs" / "mcp" / f"{label}.log"
        if path.exists():
            QDesktopServices.openUrl(QUrl.fromLocalFile(str(path)))
        else:
            self.notice.emit(f"{label} has no log yet: it has not run.")

    def _fill_imports(self) -> None:
        menu = self.importing.menu()
        menu.clear()
        for app, path in found_elsewhere().items():
            menu.addAction(f"{app} ({path})").triggered.connect(
                lambda _=False, p=path: self.import_file(p))
        menu.addAction("Choose a file…").triggered.connect(self._choose)

    def _choose(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import MCP servers", str(Path.home()),
                                              "MCP configuration (*.json)")
        if path:
            self.import_file(Path(path))

    def import_file(self, path: Path) -> None:
        start_task(lambda _t: import_from(self.where, path), on_done=self._imported,
                   on_error=lambda e: self.error.emit(f"Importing failed: {e}"), owner=self)

    def _imported(self, added: list[str]) -> None:
        self.notice.emit(f"Imported {', '.join(added)}" if added else
                         "Nothing new to import: those servers are here already")
        self.refresh()


def _short(server: dict) -> str:
    """A stdio server's program by its name (the whole path in the tooltip): a long path
    cannot wrap in a narrow page."""
    if server["kind"] != "stdio":
        return server["describe"]
    program, _, rest = server["describe"].partition(" ")
    return " ".join([Path(program).name, rest]).strip()


def _clear(layout) -> None:
    while layout.count():
        item = layout.takeAt(0)
        if item.widget():
            item.widget().deleteLater()
        elif item.layout():
            _clear(item.layout())
