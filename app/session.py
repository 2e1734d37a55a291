"""The replies being generated, at most one per conversation, several conversations at
once (the engine batches them). Qt-free: the window starts a reply, feeds it the pieces
its task receives and finishes it; what a reply has so far is here, not in a widget, so
switching conversations shows each one's own reply as it grows."""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field

from .attachments import content_parts
from .history import History, SavedConversation, SavedMessage
from .tool_rounds import history_messages


@dataclass
class PendingReply:
    """One reply on its way."""
    conversation_id: int
    text: str = ""
    reasoning: str = ""  # its thinking so far (reasoning models), shown apart
    pieces: int = 0
    tools: list[dict] = field(default_factory=list)  # its tool calls so far (ToolRound JSON)
    approvals: list = field(default_factory=list)  # calls waiting for the user (Approval)
    task: object = field(default=None, repr=False)  # what runs it (a ui Task), to cancel


class NotSaved(RuntimeError):
    """A finished reply the history could not store (a full disk): its text is kept in
    `Sessions.unsaved`, to stay on screen."""


class Sessions:
    def __init__(self, history: History):
        self.history = history
        self._replies: dict[int, PendingReply] = {}
        self._unsaved: dict[int, PendingReply] = {}

    def request(self, conversation: SavedConversation) -> list[dict]:
        """The messages to send for the conversation's next reply."""
        messages = ([{"role": "system", "content": conversation.system_prompt}]
                    if conversation.system_prompt.strip() else [])
        for m in self.history.messages(conversation.id):
            if m.role == "assistant":
                messages += history_messages(m.tools)  # what its tools answered
            if m.content or m.attachments:
                messages.append({"role": m.role, "content": content_parts(m.content,
                                                                          m.attachments)})
        return messages

    def start(self, conversation_id: int) -> PendingReply:
        if conversation_id in self._replies:
            raise RuntimeError("this conversation is already being answered")
        reply = self._replies[conversation_id] = PendingReply(conversation_id)
        return reply

    def feed(self, conversation_id: int, piece: str,
             kind: str = "content") -> PendingReply | None:
        reply = self._replies.get(conversation_id)
        if reply is not None:
            if kind == "reasoning":
                reply.reasoning += piece
            else:
                reply.text += piece
            reply.pieces += 1
        return reply

    def add_tool(self, conversation_id: int, done: dict) -> PendingReply | None:
        """A finished tool call of the reply (a ToolRound's JSON)."""
        reply = self._replies.get(conversation_id)
        if reply is not None:
            reply.tools.append(done)
        return reply

    def finish(self, conversation_id: int, status: str, model: str | None = None,
               detail: str = "", stats: str = "", thought_s: float | None = None,
               sources: list[dict] = ()) -> SavedMessage | None:
        """Store what the reply has (complete, stopped or interrupted), its thinking apart,
        with the model that answered and how, and end it."""
        reply = self._replies.pop(conversation_id, None)
        if reply is None:
            return None
        try:
            saved = self.history.add_message(conversation_id, "assistant", reply.text, status,
                                             model, detail, stats, reply.reasoning, thought_s,
                                             reply.tools, sources)
        except (OSError, sqlite3.Error) as exc:
            self._unsaved[conversation_id] = reply
            raise NotSaved(f"The answer could not be saved ({exc}): it stays on screen until "
                           "you leave this conversation; copy what you need.") from exc
        self._unsaved.pop(conversation_id, None)
        return saved

    def unsaved(self, conversation_id: int | None) -> PendingReply | None:
        """The last reply of the conversation that could not be saved, if any."""
        return self._unsaved.get(conversation_id) if conversation_id is not None else None

    def reply(self, conversation_id: int | None) -> PendingReply | None:
        return self._replies.get(conversation_id) if conversation_id is not None else None

    def running(self) -> list[PendingReply]:
        return list(self._replies.values())
