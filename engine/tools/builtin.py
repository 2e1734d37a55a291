"""Tools the engine itself serves beside the user's MCP servers, offered and approved the
same way: `documents`, whose `search_documents` searches the user's collections (as Jan
offers retrieval as a tool), so a model that calls tools can look things up itself."""

from __future__ import annotations

import json
import time
from typing import Callable

from .calls import ToolResult, cut, error_result
from .config import ServerSpec

DOCUMENTS = "documents"


class DocumentSearch:
    def __init__(self, search: Callable[[str, str, int], list[dict]],
                 names: Callable[[], list[str]]):
        self._search, self._names = search, names
        self.spec = ServerSpec(DOCUMENTS, command="homerack", args=("search_documents",))

    def tools(self) -> list:
        from mcp.types import Tool, ToolAnnotations

        names = self._names()
        return [Tool(
            name="search_documents",
            description="Search the user's documents (their collections on this machine) "
                        "for passages about a question; each result names its file and page "
                        "or lines.",
            inputSchema={"type": "object", "required": ["query"], "properties": {
                "query": {"type": "string", "maxLength": 1000,
                          "description": "what to look for, in words"},
                "collection": {"type": "string", "enum": names} if names else
                {"type": "string"},
                "top_k": {"type": "integer", "minimum": 1, "maximum": 10}}},
            annotations=ToolAnnotations(readOnlyHint=True, destructiveHint=False,
                                        openWorldHint=False))]

    def call(self, name: str, arguments: dict, max_chars: int) -> ToolResult:
        started = time.monotonic()
        if name != "search_documents":
            return error_result(f"{DOCUMENTS} has no tool {name!r}")
        names = [arguments["collection"]] if arguments.get("collection") else self._names()
        if not names:
            return error_result("There are no document collections yet.")
        query, top_k = str(arguments.get("query") or ""), arguments.get("top_k") or 5
        try:
            found = [passage for label in names
                     for passage in self._search(label, query, int(top_k))]
        except Exception as exc:  # noqa: BLE001 - a bad query or collection: the model is told
            return error_result(getattr(exc, "message", str(exc)))
        found.sort(key=lambda p: -p["score"])
        shown = [{k: p[k] for k in ("path", "page", "start_line", "end_line", "text")
                  if k in p} for p in found[:int(top_k)]]
        return cut(ToolResult(json.dumps(shown, ensure_ascii=False, indent=1),
                              seconds=time.monotonic() - started), max_chars)
