"""What the user decided for each tool: allow, ask or deny, bound to the server's identity
(its command and arguments, or its URL), kept in a private file and revocable. Only the
user's own choices write it (the app's approval card, Settings): nothing a model or a tool
result says can change it."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..files import read_json, write_atomic
from .config import ServerSpec

ALLOW, ASK, DENY = "allow", "ask", "deny"
# beside the approvals file: present, tools the server marks read-only run unasked
READ_ONLY_UNASKED = "tools-read-only-unasked"
_SCHEMA = {"type": "object", "additionalProperties": {
    "type": "object", "required": ["server", "describe", "tools"],
    "properties": {"server": {"type": "string"}, "describe": {"type": "string"},
                   "tools": {"type": "object", "additionalProperties": {
                       "enum": [ALLOW, ASK, DENY]}}}}}


@dataclass(frozen=True)
class Hints:
    """What the server says of a tool (MCP's annotations): hints, never trusted to allow
    what the user did not, except read-only tools, which the user may let run unasked."""
    read_only: bool = False
    destructive: bool = True  # MCP's default when a server does not say


def default_policy(hints: Hints, read_only_unasked: bool) -> str:
    return ALLOW if hints.read_only and not hints.destructive and read_only_unasked else ASK


@dataclass(frozen=True)
class Approval:
    identity: str
    server: str
    describe: str
    tool: str
    decision: str


class Approvals:
    """The file of decisions, read on each question (the app writes it, the engine reads)."""

    def __init__(self, path: Path | None, read_only_unasked: bool | None = None):
        """read_only_unasked None: the user's switch (a file beside `path`)."""
        self.path, self._read_only_unasked = path, read_only_unasked

    @property
    def read_only_unasked(self) -> bool:
        if self._read_only_unasked is not None:
            return self._read_only_unasked
        return bool(self.path) and (self.path.parent / READ_ONLY_UNASKED).exists()

    def policy(self, spec: ServerSpec, tool: str, hints: Hints = Hints()) -> str:
        """allow, ask or deny. A destructive tool asks unless the user chose "always"."""
        chosen = self._read().get(spec.identity, {}).get("tools", {}).get(tool)
        if chosen:
            return chosen
        return default_policy(hints, self.read_only_unasked)

    def decide(self, spec: ServerSpec, tool: str, decision: str) -> None:
        self.decide_for(spec.identity, spec.label, spec.describe(), tool, decision)

    def decide_for(self, identity: str, label: str, describe: str, tool: str,
                   decision: str) -> None:
        """A decision for the server of `identity` (as the engine lists it)."""
        if decision not in (ALLOW, ASK, DENY):
            raise ValueError(decision)
        data = self._read()
        entry = data.setdefault(identity, {"server": label, "describe": describe, "tools": {}})
        entry["server"], entry["describe"] = label, describe
        entry["tools"][tool] = decision
        self._write(data)

    def revoke(self, identity: str, tool: str | None = None) -> bool:
        """Forget a decision (the tool asks again), or all of a server's."""
        data = self._read()
        entry = data.get(identity)
        if entry is None or (tool is not None and tool not in entry["tools"]):
            return False
        if tool is None:
            del data[identity]
        else:
            del entry["tools"][tool]
        self._write(data)
        return True

    def entries(self) -> list[Approval]:
        return [Approval(identity, e["server"], e["describe"], tool, decision)
                for identity, e in sorted(self._read().items(), key=lambda kv: kv[1]["server"])
                for tool, decision in sorted(e["tools"].items())]

    def _read(self) -> dict:
        return read_json(self.path, _SCHEMA) or {}

    def _write(self, data: dict) -> None:
        if self.path is None:
            raise OSError("no approvals file")
        write_atomic(self.path, json.dumps(data, indent=2, sort_keys=True) + "\n")
