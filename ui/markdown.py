"""Conversation text to the Markdown the chat view shows, with copy links."""

from __future__ import annotations

import re
from dataclasses import dataclass

FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.DOTALL)
ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System"}
STATUS_NOTES = {"interrupted": "*(interrupted: the engine stopped)*", "stopped": "*(stopped)*"}


@dataclass(frozen=True)
class Shown:
    """One message as the view shows it."""
    key: str
    role: str
    content: str
    status: str = "complete"
    meta: str = ""  # who answered and how: the model, "from the response cache"


def with_copy_links(text: str, codes: list[str]) -> str:
    """Append a copy link after each complete fenced code block."""
    def add_link(match: re.Match) -> str:
        codes.append(match.group(1))
        return f"{match.group(0)}\n\n[Copy code](copycode:{len(codes) - 1})\n"
    return FENCE.sub(add_link, text)


def render(messages: list[Shown]) -> tuple[str, list[str], dict[str, str]]:
    """Markdown for the view, the code blocks by index, and message texts by key."""
    codes: list[str] = []
    texts: dict[str, str] = {}
    parts = []
    for message in messages:
        texts[message.key] = message.content
        meta = f" · *{message.meta}*" if message.meta else ""
        header = (f"**{ROLE_NAMES.get(message.role, message.role)}**{meta} · "
                  f"[Copy](copymsg:{message.key})")
        body = with_copy_links(message.content, codes) if message.content else "…"
        note = STATUS_NOTES.get(message.status)
        parts.append("\n\n".join(p for p in (header, body, note) if p))
    return "\n\n---\n\n".join(parts), codes, texts
