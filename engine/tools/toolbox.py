"""What the engine offers of MCP: the configured servers (mcp.json, read again when it
changes), those a request names (only when the user allowed it, and never a program),
their tools with each one's policy, and running a call with the policy checked and the
call logged. The routes reach it as `engine.tools`."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from ..errors import Forbidden, InvalidRequest
from ..outbound import AddressRefused, bad_headers, checked_address
from .approvals import ALLOW, DENY, Approvals, Hints
from .calls import MAX_RESULT_CHARS, CallLog, ToolResult, error_result
from .config import ServerConfig, ServerSpec, read_config, spec_of
from .servers import ToolServers

REQUEST_SERVERS_OFF = ("this engine reaches no MCP server a request names: the user can "
                       "allow it in Settings (Tools) or with `homerack serve "
                       "--allow-request-mcp`; servers configured in mcp.json are named by "
                       "their label alone")


@dataclass(frozen=True)
class ToolInfo:
    """One tool as offered: its server, schema, hints and the user's policy."""
    server: str
    name: str
    description: str
    parameters: dict
    hints: Hints
    policy: str

    def as_json(self) -> dict:
        return {"server": self.server, "name": self.name, "description": self.description,
                "parameters": self.parameters, "read_only": self.hints.read_only,
                "destructive": self.hints.destructive, "policy": self.policy,
                "definition": self.definition()}

    def definition(self) -> dict:
        """The OpenAI function tool the model is offered."""
        return {"type": "function", "function": {
            "name": self.name, "description": self.description[:1024],
            "parameters": self.parameters or {"type": "object", "properties": {}}}}


class Toolbox:
    def __init__(self, config: Path | None, approvals: Path | None, logs: Path | None,
                 request_servers: bool = False, servers: ToolServers | None = None):
        self.config_path, self.request_servers = config, request_servers
        self.approvals = Approvals(approvals)
        self.calls = CallLog(logs)
        self._servers_at = logs
        self._servers = servers
        self._read: tuple[float, ServerConfig] | None = None
        self.builtins: dict[str, object] = {}  # label: a tool the engine serves (builtin.py)

    @property
    def servers(self) -> ToolServers:
        if self._servers is None:  # its thread starts when a tool is first wanted
            self._servers = ToolServers(self._servers_at)
        return self._servers

    def config(self) -> ServerConfig:
        try:
            stamp = self.config_path.stat().st_mtime_ns if self.config_path else 0
        except OSError:
            stamp = 0
        if self._read is None or self._read[0] != stamp:
            self._read = (stamp, read_config(self.config_path))
        return self._read[1]

    def specs(self) -> dict[str, ServerSpec]:
        """The built-in servers and the user's (whose names come first)."""
        return {**{label: b.spec for label, b in self.builtins.items()},
                **self.config().servers}

    def spec(self, label: str, where: str = "server_label") -> ServerSpec:
        spec = self.specs().get(label)
        if spec is None:
            problem = self.config().problems.get(label)
            raise InvalidRequest(f"{where}: {label!r} " + (
                f"cannot be used: {problem}" if problem else "is not an MCP server in "
                "mcp.json" + ("" if self.request_servers else
                              " (and a request's server_url is not allowed here)")),
                param=where)
        if spec.disabled:
            raise InvalidRequest(f"{where}: the MCP server {label!r} is turned off",
                                 param=where)
        return spec

    def request_spec(self, label: str, url: str, headers: dict | None,
                     where: str) -> ServerSpec:
        """A server a request names by URL: refused unless the user allowed such servers."""
        if not self.request_servers:
            raise Forbidden(REQUEST_SERVERS_OFF, param=where)
        refused = bad_headers(headers)
        if refused:
            field = where.rsplit(".", 1)[0] + ".headers"
            raise InvalidRequest(f"{field}: {', '.join(refused)} cannot be set by a request",
                                 param=field)
        entry = {"url": url, "headers": headers or {}}
        spec = spec_of(label, entry, where)
        allowed = self._user_hosts()
        parts = urlsplit(spec.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:  # said now, in words; checked again at every connection (outbound.py)
            checked_address(parts.hostname or "", port, allowed)
        except AddressRefused as exc:
            raise Forbidden(f"{where}: {exc} (list the server in mcp.json to use it)",
                            param=where) from None
        except httpx.ConnectError as exc:
            raise InvalidRequest(f"{where}: {exc}", param=where) from None
        return ServerSpec(spec.label, url=spec.url, headers=spec.headers, from_request=True,
                          allowed_hosts=allowed)

    def _user_hosts(self) -> frozenset[str]:
        """The hosts of the user's own HTTP servers in mcp.json: a request may name them
        wherever they are (the user listed them)."""
        return frozenset((urlsplit(s.url).hostname or "").lower()
                         for s in self.config().servers.values() if s.url)

    def offered(self, spec: ServerSpec) -> list[ToolInfo]:
        """Its tools with their policies (starting it if needed); denied ones included,
        so that the app can show them (the request leaves them out)."""
        out = []
        builtin = self._builtin(spec)
        for tool in builtin.tools() if builtin else self.servers.tools(spec):
            notes = tool.annotations
            read_only = bool(notes and notes.readOnlyHint)
            # MCP: destructiveHint means something only for a tool that is not read-only,
            # and a tool that says nothing may destroy
            hints = Hints(read_only, destructive=not read_only and not (
                notes and notes.destructiveHint is False))
            out.append(ToolInfo(spec.label, tool.name, tool.description or "",
                                tool.inputSchema or {}, hints,
                                self.approvals.policy(spec, tool.name, hints)))
        return out

    def listing(self) -> dict:
        """Every configured server, its state, its tools and the problems of those that
        cannot be used. A server that will not start is listed with why."""
        config, running = self.config(), self.servers.status() if self._servers else {}
        servers = []
        for label, spec in self.specs().items():
            builtin = self._builtin(spec)
            if builtin:
                running[label] = {"state": "ready", "error": None, "starts": 0,
                                  "tools": len(builtin.tools()), "log": ""}
            entry = {"label": label, "kind": "built in" if builtin else spec.kind,
                     "describe": spec.describe(),
                     "identity": spec.identity, "disabled": spec.disabled,
                     **running.get(label, {"state": "stopped", "error": None, "starts": 0,
                                           "tools": 0, "log": ""})}
            servers.append(entry)
        return {"servers": servers, "problems": config.problems,
                "request_servers": self.request_servers,
                "approvals": self.decisions()}

    def decisions(self) -> list[dict]:
        """The user's lasting decisions, as the routes list them."""
        return [a.__dict__ for a in self.approvals.entries()]

    def tools_of(self, label: str) -> list[ToolInfo]:
        return self.offered(self.spec(label, "server"))

    def policy(self, spec: ServerSpec, tool: str) -> str:
        """The tool's policy, with its server's hints (the server is started if needed)."""
        found = next((t for t in self.offered(spec) if t.name == tool), None)
        return found.policy if found else self.approvals.policy(spec, tool)

    def run(self, spec: ServerSpec, tool: str, arguments, approved: str,
            max_chars: int = MAX_RESULT_CHARS) -> ToolResult:
        """Run one call the user (or the request's approval) allowed; a tool the user
        denied is never run, whatever the caller says."""
        if not isinstance(arguments, dict):
            result = error_result("the arguments must be a JSON object")
        elif self.approvals.policy(spec, tool) == DENY:
            result = error_result(f"The user does not allow {tool} of {spec.label}.")
        elif self._builtin(spec):
            result = self._builtin(spec).call(tool, arguments, max(256, max_chars))
        else:
            result = self.servers.call(spec, tool, arguments, max(256, max_chars))
        self.calls.add(spec.label, spec.identity, tool, arguments if isinstance(
            arguments, dict) else {"not an object": json.dumps(arguments)[:200]},
            result, approved)
        return result

    def _builtin(self, spec: ServerSpec):
        builtin = self.builtins.get(spec.label)
        return builtin if builtin is not None and builtin.spec == spec else None

    def remember(self, spec: ServerSpec, tool: str, decision: str) -> None:
        """A tool made stricter: it asks, or it is denied. A lasting allow is the user's
        own, written by the app where the user clicked (app/tool_config.py), never by a
        request: whoever holds the token could otherwise allow any tool for good."""
        if decision == ALLOW:
            raise Forbidden("a tool is allowed for good only by the user, in the app (its "
                            "approval card or Tools page)", param="decision")
        if decision not in (DENY, "ask"):
            raise InvalidRequest("decision must be ask or deny", param="decision")
        self.approvals.decide(spec, tool, decision)

    def close(self) -> None:
        if self._servers is not None:
            self._servers.close()
