"""The user's MCP servers as the app and the CLI reach them (the engine reads the same
mcp.json: engine/tools/config.py): the file, made with an empty skeleton to edit, and the
servers of another app's file imported into it."""

from __future__ import annotations

import json
from pathlib import Path

from engine.files import write_atomic
from engine.tools.approvals import ALLOW, Approvals
from engine.tools.config import import_servers, other_apps_files, usable_keyring

from .paths import Paths

SKELETON = {"mcpServers": {}}


def config_file(where: Paths) -> Path:
    """mcp.json, created empty when missing (for the user to open and fill)."""
    path = where.mcp_config
    if not path.exists():
        write_atomic(path, json.dumps(SKELETON, indent=2) + "\n")
    return path


def allow_for_good(approvals: Path, server: dict, tool: str) -> None:
    """The user's "Always allow" for `tool` of `server` (an entry of the engine's server
    listing: its label, identity and description), written here, where the user clicked:
    the engine's API never writes a lasting allow."""
    Approvals(approvals).decide_for(server["identity"], server["label"], server["describe"],
                                    tool, ALLOW)


def decide(client, where: Paths, label: str, tool: str, decision: str) -> None:
    """The Tools page's choice for a tool: an allow written here (allow_for_good), ask
    and deny through the engine."""
    if decision != ALLOW:
        client.decide_tool(label, tool, decision)
        return
    server = next(s for s in client.mcp_servers()["servers"] if s["label"] == label)
    allow_for_good(where.tool_approvals, server, tool)


def import_from(where: Paths, source: Path) -> list[str]:
    """The servers of `source` added (none replaced); their secrets in the keyring."""
    return import_servers(source, where.mcp_config)


def found_elsewhere() -> dict[str, Path]:
    """Other apps' MCP files on this machine: Claude Desktop, Cursor, LM Studio."""
    return other_apps_files(Path.home())


def keyring_note() -> str:
    backend = usable_keyring()
    return (f"Secrets (tokens, keys, Authorization headers) are kept in {type(backend).__name__}"
            if backend else "No system keyring here: secrets stay in mcp.json, which only "
            "you can read (0600)")
