"""Conversations and their messages, persisted in SQLite under the user data folder."""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    model TEXT,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: ids key the view's copy links
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'complete'  -- or 'interrupted'
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
"""
# Columns added after the first release, for databases created before them.
ADDED_COLUMNS = {
    "conversations": {"routed": "INTEGER NOT NULL DEFAULT 0"},  # model "auto"
    "messages": {"model": "TEXT", "detail": "TEXT NOT NULL DEFAULT ''"},  # who answered, how
}


# Small models answer far better with a plain instruction than with none.
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


@dataclass(frozen=True)
class SavedConversation:
    id: int
    title: str
    system_prompt: str
    model: str | None
    routed: bool = False  # each reply goes to model "auto" (the small or the large one)


@dataclass(frozen=True)
class SavedMessage:
    id: int
    role: str
    content: str
    status: str = "complete"
    model: str | None = None  # the model that answered (assistant messages)
    detail: str = ""  # how: "from the response cache", "routed: ..."


class History:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path)
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.executescript(SCHEMA)
        self._add_columns()

    def _add_columns(self) -> None:
        with self._db:
            for table, columns in ADDED_COLUMNS.items():
                have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
                for name, kind in columns.items():
                    if name not in have:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")

    def create(self, title: str = "New chat", system_prompt: str = DEFAULT_SYSTEM_PROMPT,
               model: str | None = None) -> SavedConversation:
        with self._db:
            cursor = self._db.execute(
                "INSERT INTO conversations (title, system_prompt, model, updated) VALUES (?,?,?,?)",
                (title, system_prompt, model, time.time()))
        return SavedConversation(cursor.lastrowid, title, system_prompt, model)

    def conversations(self, search: str = "") -> list[SavedConversation]:
        """Newest first; `search` matches titles and message text."""
        pattern = f"%{search}%"
        rows = self._db.execute(
            "SELECT id, title, system_prompt, model, routed FROM conversations c WHERE ? = '' "
            "OR title LIKE ? OR EXISTS (SELECT 1 FROM messages m WHERE "
            "m.conversation_id = c.id AND m.content LIKE ?) ORDER BY updated DESC, id DESC",
            (search, pattern, pattern))
        return [_conversation(row) for row in rows]

    def get(self, conversation_id: int) -> SavedConversation:
        row = self._db.execute("SELECT id, title, system_prompt, model, routed FROM conversations "
                               "WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:
            raise KeyError(conversation_id)
        return _conversation(row)

    def update(self, conversation_id: int, **fields) -> None:
        allowed = {"title", "system_prompt", "model", "routed"}
        if not fields.keys() <= allowed:
            raise ValueError(f"unknown fields: {set(fields) - allowed}")
        assignments = ", ".join(f"{name} = ?" for name in fields)
        with self._db:
            self._db.execute(f"UPDATE conversations SET {assignments}, updated = ? WHERE id = ?",
                             (*fields.values(), time.time(), conversation_id))

    def delete(self, conversation_id: int) -> None:
        with self._db:
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    def messages(self, conversation_id: int) -> list[SavedMessage]:
        rows = self._db.execute("SELECT id, role, content, status, model, detail FROM messages "
                                "WHERE conversation_id = ? ORDER BY id", (conversation_id,))
        return [SavedMessage(*row) for row in rows]

    def add_message(self, conversation_id: int, role: str, content: str,
                    status: str = "complete", model: str | None = None,
                    detail: str = "") -> SavedMessage:
        with self._db:
            cursor = self._db.execute(
                "INSERT INTO messages (conversation_id, role, content, status, model, detail) "
                "VALUES (?,?,?,?,?,?)", (conversation_id, role, content, status, model, detail))
            self._db.execute("UPDATE conversations SET updated = ? WHERE id = ?",
                             (time.time(), conversation_id))
        return SavedMessage(cursor.lastrowid, role, content, status, model, detail)

    def delete_messages_from(self, conversation_id: int, message_id: int) -> None:
        """Drop a message and everything after it (regenerate, edit-and-resend)."""
        with self._db:
            self._db.execute("DELETE FROM messages WHERE conversation_id = ? AND id >= ?",
                             (conversation_id, message_id))

    def close(self) -> None:
        self._db.close()


def _conversation(row: tuple) -> SavedConversation:
    *head, routed = row
    return SavedConversation(*head, bool(routed))
