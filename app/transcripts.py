"""Conversations out of the app and back in: Markdown to read or share, JSON to import
again (into this or another machine's Homerack). Only the branch shown is exported: the
alternatives a conversation keeps are the user's drafts."""

from __future__ import annotations

import json

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
                          "model": m.model, "detail": m.detail}
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
            lines += [f"## {who}{by}", "", message.content.strip(), ""]
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


def import_json(history: History, text: str) -> list[SavedConversation]:
    """The conversations in `text` added to `history` (new ones: nothing is replaced)."""
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise ImportError_(f"the file is not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ImportError_("the file is not a Homerack conversation export (no "
                           f'"format": "{FORMAT}")')
    added = []
    for item in data.get("conversations") or []:
        messages = item.get("messages") if isinstance(item, dict) else None
        if not isinstance(messages, list):
            raise ImportError_("a conversation in the file has no list of messages")
        conversation = history.create(str(item.get("title") or "Imported chat"),
                                      str(item.get("system_prompt") or ""), item.get("model"))
        for message in messages:
            if message.get("role") not in ROLES or not isinstance(message.get("content"), str):
                continue  # a message the app cannot show
            history.add_message(conversation.id, message["role"], message["content"],
                                str(message.get("status") or "complete"), message.get("model"),
                                str(message.get("detail") or ""))
        history.update(conversation.id, adapters=_adapters(item.get("adapters")))
        added.append(history.get(conversation.id))
    return added
