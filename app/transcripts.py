"""Conversations out of the app and back in: Markdown to read or share, JSON to import
again (into this or another machine's Homerack). Only the branch shown is exported: the
alternatives a conversation keeps are the user's drafts."""

from __future__ import annotations

import base64
import binascii
import json
import sqlite3
from pathlib import Path

import jsonschema

from .attachments import FILE, PICTURE, Attachment, from_markdown
from .history import History, SavedConversation

FORMAT = "homerack-conversations"
VERSION = 2  # 2: attachments apart from the text (1: in it, as Markdown; still imported)
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
                          **({"sources": m.sources} if m.sources else {}),
                          **({"attachments": [_exported(a) for a in m.attachments]}
                             if m.attachments else {})}
                         for m in history.messages(conversation.id)]}


def _exported(attachment: Attachment) -> dict:
    return {"kind": attachment.kind, "name": attachment.name,
            "data": base64.b64encode(attachment.data).decode(),
            **({"truncated": True} if attachment.truncated else {})}


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
            lines += [item for a in message.attachments for item in (a.as_markdown(), "")]
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
_ATTACHMENT = {"type": "object", "required": ["kind", "name", "data"],
               "properties": {"kind": {"enum": [PICTURE, FILE]}, "name": {"type": "string"},
                              "data": {"type": "string"}, "truncated": {"type": "boolean"}}}
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
                               "tools": {"type": "array", "maxItems": 64, "items": _ROUND},
                               "attachments": {"type": "array", "maxItems": 16,
                                               "items": _ATTACHMENT}}}}}}}}}


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
    try:
        attached = [[_imported(message, (i, j)) for j, message in enumerate(item["messages"])]
                    for i, item in enumerate(data["conversations"])]
    except ValueError as exc:
        raise ImportError_(str(exc)) from None
    created: list[int] = []
    try:
        for item, attachments in zip(data["conversations"], attached):
            conversation = history.create(item.get("title") or "Imported chat",
                                          item.get("system_prompt") or "", item.get("model"))
            created.append(conversation.id)
            _fill(history, conversation, item, attachments)
    except (OSError, sqlite3.Error) as exc:
        history.remove(created)
        raise ImportError_(f"the history could not take them ({exc})") from None
    return [history.get(i) for i in created]


def _imported(message: dict, where: tuple[int, int]) -> tuple[str, tuple[Attachment, ...]]:
    """A message's text and attachments as an export carries them (a version 1 export:
    in its text), every picture's header read as the engine reads one; a ValueError
    naming the message for one that is not."""
    from engine.conversation import images
    from engine.errors import InvalidRequest

    text, attachments = message["content"], ()
    if message["role"] == "user":
        text, attachments = from_markdown(text)
    at = f"conversations/{where[0]}/messages/{where[1]}/attachments"
    for i, item in enumerate(message.get("attachments") or ()):
        try:
            data = base64.b64decode(item["data"], validate=True)
        except binascii.Error:
            raise ValueError(f"the file is not a Homerack conversation export (at {at}/{i}: "
                             "its data is not base64)") from None
        if item["kind"] == FILE:
            data = data.decode(errors="replace").encode()
        attachments += (Attachment(item["kind"], item["name"], data,
                                   bool(item.get("truncated"))),)
    for i, attachment in enumerate(attachments):
        try:
            if attachment.image:
                images.read_image(attachment.data, f"{at}/{i}")
        except InvalidRequest as exc:
            raise ValueError(f"a picture in the file cannot be shown ({exc.message})") from None
    return text, attachments


def _fill(history: History, conversation: SavedConversation, item: dict,
          attached: list[tuple[str, tuple[Attachment, ...]]]) -> None:
    for message, (text, attachments) in zip(item["messages"], attached):
        if message["role"] not in ROLES:
            continue  # a message the app cannot show
        history.add_message(conversation.id, message["role"], text,
                            message.get("status") or "complete", message.get("model"),
                            message.get("detail") or "",
                            reasoning=message.get("reasoning") or "",
                            tools=message.get("tools") or [], attachments=attachments)
    history.update(conversation.id, adapters=_adapters(item.get("adapters")))
