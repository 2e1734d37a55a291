"""The composer's Tools button: the MCP servers (Settings → Tools, mcp.json) whose tools
the chat's model is offered, each on or off, and a tool the next reply must call (for
models too small to choose one); its text says how many tools are on and what they cost
in the model's tokens, so that a small context is not filled unawares. The choice is the
window's state (`tool_servers`, `forced_tool`), kept in a small settings file."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QMenu, QToolButton

from app.settings import ToolChoice, load_settings, save_settings
from app.tool_rounds import offered_tools

from ..state import WindowState
from ..tasks import start_task

FILE = "tool-servers.json"
CROWDED = 0.25  # of the context taken by the tools' definitions: said on the button


class ToolsButton(QToolButton):
    def __init__(self, state: WindowState, engine, data: Path, parent=None):
        super().__init__(parent)
        self.state, self.engine, self.data = state, engine, data
        self.servers: list[dict] = []  # the engine's listing, when last read
        self.tools: list = []  # the enabled servers' OfferedTools, when last counted
        self._tokens = 0  # what offering them costs, in the model's tokens
        self.setText("Tools")
        self.setAccessibleName("Tools")
        self.setPopupMode(QToolButton.InstantPopup)
        self.setMenu(QMenu(self))
        self.menu().aboutToShow.connect(self.refresh)
        state.update(tool_servers=load_settings(data / FILE, ToolChoice).labels)
        state.changed.connect(self._on_changed)

    def refresh(self) -> None:
        """Read the servers again (off the UI thread) and rebuild the menu."""
        client = self.engine.client
        if client is None:
            return
        start_task(lambda _t: client.mcp_servers(), on_done=self._on_servers,
                   on_error=lambda e: self._fill(f"The tool servers cannot be read: {e}"),
                   owner=self)

    def _on_servers(self, listing: dict) -> None:
        self.servers = listing["servers"]
        self._fill("" if self.servers or listing["problems"] else
                   "No tool servers yet: add them in Settings → Tools")

    def _fill(self, note: str) -> None:
        menu, chosen = self.menu(), set(self.state.now.tool_servers)
        menu.clear()
        if note:
            menu.addAction(note).setEnabled(False)
        for server in self.servers:
            action = menu.addAction(f"{server['label']} ({server['kind']}) — "
                                    f"{server['describe'][:60]}")
            action.setCheckable(True)
            action.setChecked(server["label"] in chosen)
            action.setEnabled(not server["disabled"])
            action.toggled.connect(lambda on, label=server["label"]: self._toggle(label, on))
        if self.tools:
            forced = menu.addMenu("Next reply must call")
            none = forced.addAction("(the model chooses)")
            none.triggered.connect(lambda: self.state.update(forced_tool=None))
            for tool in self.tools:
                name = f"{tool.server}/{tool.name}"
                action = forced.addAction(name)
                action.setCheckable(True)
                action.setChecked(self.state.now.forced_tool == name)
                action.triggered.connect(lambda _=False, n=name: self.state.update(forced_tool=n))

    def _toggle(self, label: str, on: bool) -> None:
        servers = [s for s in self.state.now.tool_servers if s != label] + ([label] if on else [])
        self.state.update(tool_servers=tuple(servers), forced_tool=None)

    def _on_changed(self, names: frozenset) -> None:
        if "tool_servers" in names:
            try:
                save_settings(self.data / FILE, ToolChoice(",".join(self.state.now.tool_servers)))
            except OSError:
                pass  # a full disk: the choice holds for this session
        if names & {"tool_servers", "model", "health"}:
            self.count()
        if "forced_tool" in names:
            self._show(self.tools, None)

    def count(self) -> None:
        """The enabled servers' tools and their size in the chosen model's tokens."""
        client, servers = self.engine.client, list(self.state.now.tool_servers)
        if client is None or not servers:
            self.tools = []
            self._show([], 0)
            return
        start_task(lambda _t: offered_tools(client, servers, self.state.now.model),
                   on_done=lambda got: self._show(got[0], got[1], got[2]),
                   on_error=lambda e: self.setToolTip(f"The tools cannot be read: {e}"),
                   owner=self)

    def _show(self, tools: list, tokens: int | None, problems: list[str] = ()) -> None:
        self.tools = tools
        if tokens is not None:
            self._tokens = tokens
        tokens = self._tokens
        forced = self.state.now.forced_tool
        context = self.state.now.context_size()
        part = tokens / context if context else 0
        share = f" ({100 * part:.0f}% of the context)" if context else ""
        self.setText(f"Tools: {len(tools)}" + (f" · must call {forced.split('/')[-1]}"
                                              if forced else "")
                     + (f" · {100 * part:.0f}% of the context" if part > CROWDED else "")
                     if tools else "Tools")
        native = "tools" in (self.state.now.entry().get("capabilities") or ())
        self.setToolTip("\n".join(
            [f"{len(tools)} tools from {', '.join(self.state.now.tool_servers)}: "
             f"{tokens:,} tokens with every request{share}; the model calls them "
             + ("in its own format" if native else "through the generic JSON form")
             if tools else
             "Offer the tools of MCP servers to the model (each call asks you first)"]
            + [f"Not reachable: {p}" for p in problems]))
