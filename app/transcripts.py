"""Conversations out of the app and back in: Markdown to read or share, JSON to import
again (into this or another machine's Homerack). Only the branch shown is exported: the
alternatives a conversation keeps are the user's drafts."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import jsonschema

from .history import History, SavedConversation

FORMAT = "homerack-conversations"
VERSION = 1
ROLES = {"user": "You", "assistant": "Assistant", "system": "System"}


class ImportError_(ValueError):
    """A file that is not an export of Homerack's conversations, said in words."""


def as_data(history: History, conversation: SavedConversation) -> dict:
    return {"title": conversation.title, "system_prompt": conversation.system_prompt,
            "model": conversation.model, "updated": conversation.updated,
            "adapters": [{"id": name, "scale": scale} for name, scale in conversation.adapters],
            "messages": [{"role": m.role, "content": m.content, "status": m.status,
                          "model": m.model, "detail": m.detail,
                          **({"reasoning": m.reasoning} if m.reasoning else {}),
                          **({"tools": m.tools} if m.tools else {}),
                          **({"sources": m.sources} if m.sources else {})}
                         for m in history.messages(conversation.id)]}


def to_json(history: History, conversations: list[SavedConversation]) -> str:
    return json.dumps({"format": FORMAT, "version": VERSION,
                       "conversations": [as_data(history, c) for c in conversations]},
                      indent=2, ensure_ascii=False)


def to_markdown(history: History, conversations: list[SavedConversation]) -> str:
    parts = []
    for conversation in conversations:
        lines = [f"# {conversation.title}", ""]
        if conversation.system_prompt.strip():
            lines += [f"*System: {conversation.system_prompt.strip()}*", ""]
        for message in history.messages(conversation.id):
            who = ROLES.get(message.role, message.role)
            by = f" ({message.model})" if message.model else ""
            lines += [f"## {who}{by}", ""]
            if message.reasoning:
                lines += ["<details><summary>Thinking</summary>", "",
                          message.reasoning.strip(), "", "</details>", ""]
            for call in message.tools:
                lines += [f"<details><summary>Tool: {call.get('server')} · {call.get('tool')} "
                          f"({call.get('status')})</summary>", "", "~~~~json",
                          json.dumps(call.get("arguments"), ensure_ascii=False), "~~~~", "",
                          "~~~~", str(call.get("result", "")), "~~~~", "", "</details>", ""]
            lines += [message.content.strip(), ""]
        parts.append("\n".join(lines))
    return "\n---\n\n".join(parts)


def _adapters(items) -> list[tuple[str, float]]:
    """An export's adapters as (id, scale); what is not one is left out."""
    out = []
    for item in items if isinstance(items, list) else ():
        if isinstance(item, dict) and isinstance(item.get("id"), str) \
                and isinstance(item.get("scale"), (int, float)):
            out.append((item["id"], float(item["scale"])))
    return out


MAX_IMPORT_BYTES = 64 << 20  # a year of daily conversations is a few MiB
_TEXT = {"type": ["string", "null"]}
_ROUND = {"type": "object", "required": ["call_id", "server", "tool", "arguments", "result",
                                        "status"],
          "properties": {"call_id": {"type": "string"}, "server": {"type": "string"},
                         "tool": {"type": "string"}, "arguments": {"type": "object"},
                         "result": {"type": "string"},
                         "status": {"enum": ["ran", "denied", "failed"]}}}
IMPORT_SCHEMA = {"type": "object", "required": ["format", "conversations"], "properties": {
    "format": {"const": FORMAT},
    "conversations": {"type": "array", "items": {
        "type": "object", "required": ["messages"],
        "properties": {
            "title": _TEXT, "system_prompt": _TEXT, "model": _TEXT,
            "messages": {"type": "array", "items": {
                "type": "object", "required": ["role", "content"],
                "properties": {"role": {"type": "string"}, "content": {"type": "string"},
                               "status": _TEXT, "model": _TEXT, "detail": _TEXT,
                               "reasoning": _TEXT,
                               "tools": {"type": "array", "maxItems": 64, "items": _ROUND}}}}}}}}}


def import_file(history: History, path: Path) -> list[SavedConversation]:
    """import_json of a file, its size checked before it is read."""
    try:
        if path.stat().st_size > MAX_IMPORT_BYTES:
            raise ImportError_(f"the file is over {MAX_IMPORT_BYTES >> 20} MiB")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ImportError_(f"the file cannot be read ({exc})") from None
    return import_json(history, text)


def import_json(history: History, text: str) -> list[SavedConversation]:
    """The conversations in `text` added to `history` (new ones: nothing is replaced):
    all of them, or, when the file is not an export or the history cannot take them (a
    full disk), none (ImportError_, saying why)."""
    if len(text) > MAX_IMPORT_BYTES:
        raise ImportError_(f"the file is over {MAX_IMPORT_BYTES >> 20} MiB")
    try:
        data = json.loads(text)
        jsonschema.validate(data, IMPORT_SCHEMA)
    except ValueError as exc:
        raise ImportError_(f"the file is not JSON ({exc})") from None
    except jsonschema.ValidationError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "the top"
        raise ImportError_(f"the file is not a Homerack conversation export (at {where}: "
                           f"{exc.message})") from None
    except RecursionError:
        raise ImportError_("the file is nested too deep to be an export") from None
    created: list[int] = []
    try:
        for item in data["conversations"]:
            conversation = history.create(item.get("title") or "Imported chat",
                                          item.get("system_prompt") or "", item.get("model"))
            created.append(conversation.id)
            _fill(history, conversation, item)
    except (OSError, sqlite3.Error) as exc:
        history.remove(created)
        raise ImportError_(f"the history could not take them ({exc})") from None
    return [history.get(i) for i in created]


def _fill(history: History, conversation: SavedConversation, item: dict) -> None:
    for message in item["messages"]:
        if message["role"] not in ROLES:
            continue  # a message the app cannot show
        history.add_message(conversation.id, message["role"], message["content"],
                            message.get("status") or "complete", message.get("model"),
                            message.get("detail") or "",
                            reasoning=message.get("reasoning") or "",
                            tools=message.get("tools") or [])
    history.update(conversation.id, adapters=_adapters(item.get("adapters")))
