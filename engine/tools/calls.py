"""A tool call's result as the model reads it: the server's content as text, an error as
an error result (MCP's `isError`: the model is told, nothing raises), cut to what the
caller's context holds and saying so; and the log of every call, with its arguments and
result, private to the user."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

MAX_RESULT_CHARS = 1 << 20  # what the engine keeps of any result, before the caller's cut
LOGGED_CHARS = 4096  # of each result, in the calls log


@dataclass(frozen=True)
class ToolResult:
    text: str
    is_error: bool = False
    cut_from: int | None = None  # the characters it had, when it was cut
    seconds: float = 0.0

    def as_json(self) -> dict:
        return asdict(self)


def result_of(result, seconds: float, max_chars: int = MAX_RESULT_CHARS) -> ToolResult:
    """An MCP CallToolResult as text: text parts as they are, structured content as JSON,
    pictures and audio named (not sent to a model that reads text), resources by text or
    address."""
    parts = []
    for item in result.content or ():
        kind = getattr(item, "type", "")
        if kind == "text":
            parts.append(item.text)
        elif kind in ("image", "audio"):
            parts.append(f"[{kind}: {item.mimeType}, {len(item.data) * 3 // 4:,} bytes]")
        elif kind == "resource":
            resource = item.resource
            parts.append(getattr(resource, "text", None) or f"[resource: {resource.uri}]")
        elif kind == "resource_link":
            parts.append(f"[resource: {item.uri}]")
    if not parts and result.structuredContent is not None:
        parts.append(json.dumps(result.structuredContent, ensure_ascii=False))
    return cut(ToolResult("\n".join(parts), bool(result.isError), seconds=seconds), max_chars)


def cut(result: ToolResult, max_chars: int) -> ToolResult:
    """The result's start, and a line saying how much was left out."""
    if len(result.text) <= max_chars:
        return result
    note = (f"\n[… cut: the result has {len(result.text):,} characters; the first "
            f"{max_chars:,} are shown]")
    return ToolResult(result.text[:max_chars] + note, result.is_error, len(result.text),
                      result.seconds)


def error_result(message: str, seconds: float = 0.0) -> ToolResult:
    return ToolResult(message, is_error=True, seconds=seconds)


class CallLog:
    """Every call: when, which server (by identity), the tool, its arguments, how it ended
    and the start of its result; one JSON line each, in a 0600 file."""

    def __init__(self, logs: Path | None):
        """`logs`: the servers' logs folder, where calls.jsonl is kept (None: no log)."""
        self.path = logs / "calls.jsonl" if logs else None

    def add(self, server: str, identity: str, tool: str, arguments: dict,
            result: ToolResult, approved: str) -> None:
        if self.path is None:
            return
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S"), "server": server,
                "identity": identity, "tool": tool, "arguments": arguments,
                "approved": approved, "is_error": result.is_error,
                "seconds": round(result.seconds, 3), "result": result.text[:LOGGED_CHARS]}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(json.dumps(line, ensure_ascii=False) + "\n")
        except OSError:  # a full disk costs the log line, never the call
            pass

    def recent(self, count: int = 100) -> list[dict]:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()[-count:] \
                if self.path else []
        except OSError:
            return []
        out = []
        for line in lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
        return out
