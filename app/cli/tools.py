"""`homerack mcp`: the MCP servers in mcp.json (listed with their tools, imported from
another app's file, and one tool called from the terminal, which is the user's own
approval), without an engine: the same configuration and servers the engine uses."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..paths import paths
from ..tool_config import found_elsewhere, import_from


def cmd_mcp(args) -> int:
    from engine.tools.config import read_config

    where = paths()
    if args.action == "import":
        return _import(where, args.target)
    config = read_config(where.mcp_config)
    if args.action == "list":
        return _list(config, where, args.json)
    spec = config.servers.get(args.target)
    if spec is None:
        print(f"error: no MCP server {args.target!r} in {where.mcp_config}", file=sys.stderr)
        return 1
    return _call(spec, args.tool, args.arguments, where)


def _import(where, target: str | None) -> int:
    found = found_elsewhere()
    if target is None:
        if not found:
            print("No other app's MCP file found here: name one (homerack mcp import FILE).")
            return 1
        sources = list(found.values())
    else:
        sources = [Path(target)]
    for source in sources:
        added = import_from(where, source)
        print(f"{source}: " + (f"added {', '.join(added)}" if added else "nothing new"))
    return 0


def _list(config, where, as_json: bool) -> int:
    from engine.tools.servers import ToolServers

    servers = ToolServers(where.tool_logs, start_s=30)
    out = {"servers": [], "problems": config.problems}
    try:
        for label, spec in config.servers.items():
            entry = {"label": label, "kind": spec.kind, "describe": spec.describe(),
                     "disabled": spec.disabled}
            if not spec.disabled:
                try:
                    entry["tools"] = [t.name for t in servers.tools(spec)]
                except Exception as exc:  # noqa: BLE001 - each server's failure said
                    entry["error"] = getattr(exc, "message", str(exc))
            out["servers"].append(entry)
    finally:
        servers.close()
    if as_json:
        print(json.dumps(out, indent=2))
        return 0
    for entry in out["servers"]:
        what = "off" if entry["disabled"] else entry.get("error") or \
            f"{len(entry['tools'])} tools: {', '.join(entry['tools'])}"
        print(f"{entry['label']:<16} {entry['kind']:<5} {entry['describe']}\n"
              f"{'':<16} {what}")
    for label, problem in config.problems.items():
        print(f"{label:<16} cannot be used: {problem}")
    if not out["servers"] and not config.problems:
        print(f"No MCP servers yet: add them to {where.mcp_config} or `homerack mcp import`.")
    return 0


def _call(spec, tool: str, arguments: str, where) -> int:
    from engine.tools.calls import CallLog
    from engine.tools.servers import ToolServers

    try:
        parsed = json.loads(arguments)
    except ValueError as exc:
        print(f"error: the arguments are not JSON ({exc})", file=sys.stderr)
        return 2
    if not isinstance(parsed, dict):
        print("error: the arguments must be a JSON object", file=sys.stderr)
        return 2
    servers = ToolServers(where.tool_logs)
    try:
        result = servers.call(spec, tool, parsed)
    finally:
        servers.close()
    CallLog(where.tool_logs).add(
        spec.label, spec.identity, tool, parsed, result, "terminal")
    print(result.text)
    return 1 if result.is_error else 0


def add_commands(sub) -> None:
    mcp = sub.add_parser("mcp", help="MCP servers: list them, import another app's, call a tool")
    mcp.add_argument("action", choices=["list", "import", "call"])
    mcp.add_argument("target", nargs="?", help="import: a file (default: the apps found "
                     "here); call: the server")
    mcp.add_argument("tool", nargs="?", help="call: the tool")
    mcp.add_argument("arguments", nargs="?", default="{}", help="call: its arguments (JSON)")
    mcp.add_argument("--json", action="store_true", help="list: as JSON")
    mcp.set_defaults(func=cmd_mcp)
