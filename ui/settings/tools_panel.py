"""Settings → Tools: the MCP servers in mcp.json with their state and their logs, the file
opened for editing, another app's servers imported (Claude Desktop, Cursor, LM Studio),
the decisions the user made for good (each revocable), and whether requests may name a
server by address. Reading the engine's list runs off the UI thread."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (QCheckBox, QComboBox, QFileDialog, QHBoxLayout, QMenu,
                               QPushButton, QToolButton, QVBoxLayout, QWidget)

from app.paths import Paths
from app.settings import READ_ONLY_UNASKED, REQUEST_MCP, switch, switched_on
from app.tool_config import config_file, decide, found_elsewhere, import_from, keyring_note

from ..safe_text import Label
from ..tasks import start_task

DECISIONS = {"allow": "always allowed", "deny": "never allowed", "ask": "asks"}
POLICIES = ("ask", "allow", "deny")


class ToolsPanel(QWidget):
    error = Signal(str)
    notice = Signal(str)

    def __init__(self, where: Paths, engine, parent=None):
        super().__init__(parent)
        self.where, self.engine = where, engine
        self.servers = QVBoxLayout()
        self.tool_rows: dict[str, QVBoxLayout] = {}  # under each server: its tools, shown
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
        self.read_only = QCheckBox("Run tools that only read without asking",
                                   accessibleName="Run read-only tools without asking")
        self.read_only.setToolTip("Tools whose server marks them read-only (and not "
                                  "destructive) run unasked; the others still ask")
        self.read_only.setChecked(switched_on(where.data, READ_ONLY_UNASKED))
        self.read_only.toggled.connect(lambda on: switch(where.data, READ_ONLY_UNASKED, on))
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
        layout.addWidget(self.read_only)
        layout.addWidget(Label("Your decisions", objectName="muted"))
        layout.addLayout(self.approvals)
        layout.addWidget(self.request_servers)
        layout.addWidget(Label(
            "Off, API requests may use only the servers above, by name; on, also a server "
            "a request names by a public URL (never a program, never this computer or your "
            "network unless its host is in mcp.json). Applies the next time Homerack "
            "starts.", objectName="muted", wordWrap=True))
        layout.addStretch(1)

    def refresh(self, servers: bool = True) -> None:
        """Read the engine's list again; `servers` False: only the decisions (the tools
        shown stay open)."""
        client = self.engine.client
        if client is not None:
            start_task(lambda _t: client.mcp_servers(),
                       on_done=self._show if servers else self._show_decisions,
                       on_error=lambda e: self.error.emit(f"The tool servers: {e}"), owner=self)

    def _show(self, listing: dict) -> None:
        _clear(self.servers)
        self.tool_rows = {}
        for server in listing["servers"]:
            state = server["state"] + (f", {server['tools']} tools" if server["tools"] else "")
            if server["error"]:
                state += f": {server['error']}"
            row = QHBoxLayout()
            line = Label(f"{server['label']} ({server['kind']}) — {_short(server)}"
                         f" · {'off' if server['disabled'] else state}", wordWrap=True)
            line.setToolTip(server["describe"])
            row.addWidget(line, 1)
            tools = QPushButton("Tools…", accessibleName=f"The tools of {server['label']}")
            tools.clicked.connect(lambda _=False, s=server["label"]: self.show_tools(s))
            row.addWidget(tools)
            if server["kind"] == "stdio":
                log = QPushButton("Log", accessibleName=f"Open the log of {server['label']}")
                log.clicked.connect(lambda _=False, s=server["label"]: self._open_log(s))
                row.addWidget(log)
            self.servers.addLayout(row)
            self.tool_rows[server["label"]] = QVBoxLayout()
            self.servers.addLayout(self.tool_rows[server["label"]])
        for label, problem in listing["problems"].items():
            self.servers.addWidget(Label(f"{label}: {problem}", objectName="muted",
                                         wordWrap=True))
        if not listing["servers"] and not listing["problems"]:
            self.servers.addWidget(Label("No tool servers yet.", objectName="muted"))
        self._show_decisions(listing)

    def _show_decisions(self, listing: dict) -> None:
        _clear(self.approvals)
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

    def show_tools(self, label: str) -> None:
        """The server's tools, each with its policy to choose (the server is started)."""
        client = self.engine.client
        if client is not None:
            start_task(lambda _t: client.mcp_tools(label),
                       on_done=lambda listed: self._show_tools(label, listed["tools"]),
                       on_error=lambda e: self.error.emit(f"{label}: {e}"), owner=self)

    def _show_tools(self, label: str, tools: list[dict]) -> None:
        rows = self.tool_rows.get(label)
        if rows is None:
            return
        _clear(rows)
        for tool in tools:
            row = QHBoxLayout()
            kind = "reads only" if tool["read_only"] else \
                "may delete" if tool["destructive"] else "may change"
            name = Label(f"  {tool['name']} ({kind})", wordWrap=True)
            name.setToolTip(tool["description"][:600])
            row.addWidget(name, 1)
            policy = QComboBox(accessibleName=f"Policy of {tool['name']}")
            policy.addItems(POLICIES)
            policy.setCurrentText(tool["policy"])
            policy.currentTextChanged.connect(
                lambda chosen, t=tool["name"]: self._decide(label, t, chosen))
            row.addWidget(policy)
            rows.addLayout(row)

    def _decide(self, label: str, tool: str, decision: str) -> None:
        client = self.engine.client
        if client is not None:
            start_task(lambda _t: decide(client, self.where, label, tool, decision),
                       on_done=lambda _r: self.refresh(servers=False),
                       on_error=lambda e: self.error.emit(f"{tool}: {e}"), owner=self)

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
        path = self.where.tool_logs / f"{label}.log"
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
