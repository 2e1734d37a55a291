"""Conversations and their messages, persisted in SQLite under the user data folder.

A conversation is a tree: editing a question or regenerating an answer adds a sibling
beside the old message instead of replacing it, and the conversation's `tip` (its last
message) says which branch is shown. `messages()` is that branch, root to tip, each
message knowing its place among its siblings ("2/3"). Message text is indexed with
SQLite's FTS5 for the sidebar's search. Deleting a conversation only marks it, so the
window can offer an undo; marked ones are purged the next time the history opens.
"""

from __future__ import annotations

import json
import re
import sqlite3
import time
from dataclasses import dataclass, replace
from pathlib import Path

from .attachments import Attachment, from_markdown

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    system_prompt TEXT NOT NULL DEFAULT '',
    model TEXT,
    updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: ids key the view's links
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'complete'  -- or 'interrupted', 'stopped', 'failed'
);
CREATE INDEX IF NOT EXISTS messages_by_conversation ON messages(conversation_id, id);
CREATE TABLE IF NOT EXISTS attachments (  -- a message's files and pictures, in their order
    message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    kind TEXT NOT NULL,  -- 'picture' (an image file) or 'file' (its text, UTF-8)
    name TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    bytes BLOB NOT NULL,
    truncated INTEGER NOT NULL DEFAULT 0,  -- a file's start only
    PRIMARY KEY (message_id, position)
);
"""
# PRAGMA user_version: 1 once the messages' Markdown attachments (pictures as data URL
# images, files fenced: how versions before it stored them) are moved to their rows.
ROWS_VERSION = 1
# Columns added after the first release, for databases created before them; the SQL
# after a column fills it for the rows that were there.
ADDED_COLUMNS = {
    "conversations": {
        "routed": ("INTEGER NOT NULL DEFAULT 0", None),  # each reply to model "auto"
        "tip": ("INTEGER", "UPDATE conversations SET tip = (SELECT max(id) FROM messages m "
                           "WHERE m.conversation_id = conversations.id)"),
        "deleted": ("REAL", None),  # when it was deleted (kept for an undo)
        "adapters": ("TEXT NOT NULL DEFAULT '[]'", None),  # LoRA adapters: [[id, scale]]
    },
    "messages": {
        "model": ("TEXT", None),  # who answered
        "detail": ("TEXT NOT NULL DEFAULT ''", None),  # how: "from the response cache"
        "stats": ("TEXT NOT NULL DEFAULT ''", None),  # "42 tokens · 31.2 tok/s · 1.4 s"
        "parent": ("INTEGER", "UPDATE messages SET parent = (SELECT max(p.id) FROM messages p "
                              "WHERE p.conversation_id = messages.conversation_id "
                              "AND p.id < messages.id)"),
        "reasoning": ("TEXT NOT NULL DEFAULT ''", None),  # a reasoning model's thinking
        "thought_s": ("REAL", None),  # how long it thought
        "tools": ("TEXT NOT NULL DEFAULT '[]'", None),  # its tool calls (app/tool_rounds.py)
        "sources": ("TEXT NOT NULL DEFAULT '[]'", None),  # the passages it was given, cited
    },
}
FULL_TEXT = """
CREATE VIRTUAL TABLE message_text USING fts5(content, content='messages', content_rowid='id');
CREATE TRIGGER message_text_add AFTER INSERT ON messages BEGIN
    INSERT INTO message_text(rowid, content) VALUES (new.id, new.content); END;
CREATE TRIGGER message_text_drop AFTER DELETE ON messages BEGIN
    INSERT INTO message_text(message_text, rowid, content) VALUES ('delete', old.id, old.content);
END;
INSERT INTO message_text(message_text) VALUES ('rebuild');
"""
MESSAGE_COLUMNS = ("id, role, content, status, model, detail, stats, parent, reasoning, "
                   "thought_s, tools, sources")
PARENT = 7  # its place in MESSAGE_COLUMNS

# Small models answer far better with a plain instruction than with none.
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."


@dataclass(frozen=True)
class SavedConversation:
    id: int
    title: str
    system_prompt: str
    model: str | None
    routed: bool = False  # each reply goes to model "auto" (the small or the large one)
    updated: float = 0.0  # when it last changed (the sidebar groups by it)
    adapters: tuple[tuple[str, float], ...] = ()  # LoRA adapters over its model, by id


@dataclass(frozen=True)
class SavedMessage:
    id: int
    role: str
    content: str
    status: str = "complete"
    model: str | None = None  # the model that answered (assistant messages)
    detail: str = ""  # how: "from the response cache", "routed: ..."
    stats: str = ""  # its figures, for the view's tooltip
    parent: int | None = None
    reasoning: str = ""  # the thinking before the answer: shown and exported, never re-sent
    thought_s: float | None = None
    tools_json: str = "[]"  # the tool calls made for this answer, each a ToolRound's JSON
    sources_json: str = "[]"  # the documents' passages it was given (citations)
    variant: tuple[int, int] = (1, 1)  # its place among its siblings, and their number
    attachments: tuple[Attachment, ...] = ()  # its files and pictures, before its text

    @property
    def tools(self) -> list[dict]:
        return _list(self.tools_json)

    @property
    def sources(self) -> list[dict]:
        return _list(self.sources_json)


class History:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path)
        self._db.execute("PRAGMA foreign_keys = ON")
        # The app writes each message on its UI thread: in the default rollback journal
        # every commit waits for fsyncs (180 ms seen on a loaded 2-core machine, a visible
        # hitch as a reply ends). A write-ahead log without per-commit syncs survives a
        # crash of the app; only a power cut can lose the last messages.
        self._db.execute("PRAGMA journal_mode = WAL")
        self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.executescript(SCHEMA)
        self._add_columns()
        self._index_text()
        self._attachments_as_rows()
        self.purge()

    def _add_columns(self) -> None:
        with self._db:
            for table, columns in ADDED_COLUMNS.items():
                have = {row[1] for row in self._db.execute(f"PRAGMA table_info({table})")}
                for name, (kind, fill) in columns.items():
                    if name not in have:
                        self._db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {kind}")
                        if fill:
                            self._db.execute(fill)

    def _index_text(self) -> None:
        exists = self._db.execute("SELECT 1 FROM sqlite_master WHERE name = 'message_text'")
        if exists.fetchone() is None:
            with self._db:
                self._db.executescript(FULL_TEXT)

    def _attachments_as_rows(self) -> None:
        """Move a history's Markdown attachments to their rows, once, all or nothing."""
        if self._db.execute("PRAGMA user_version").fetchone()[0] >= ROWS_VERSION:
            return
        with self._db:
            rows = self._db.execute(
                "SELECT id, content FROM messages WHERE role = 'user' AND (content LIKE "
                "'%](data:image/%' OR content LIKE 'Attached file %')").fetchall()
            for message_id, content in rows:
                text, attachments = from_markdown(content)
                if attachments:
                    self._db.execute("UPDATE messages SET content = ? WHERE id = ?",
                                     (text, message_id))
                    self._add_attachments(message_id, attachments)
            if rows:  # the search index holds the old texts
                self._db.execute("INSERT INTO message_text(message_text) VALUES ('rebuild')")
            self._db.execute(f"PRAGMA user_version = {ROWS_VERSION}")

    def _add_attachments(self, message_id: int, attachments: tuple[Attachment, ...]) -> None:
        self._db.executemany(
            "INSERT INTO attachments (message_id, position, kind, name, sha256, bytes, "
            "truncated) VALUES (?,?,?,?,?,?,?)",
            [(message_id, i, a.kind, a.name, a.sha256, a.data, int(a.truncated))
             for i, a in enumerate(attachments)])

    def _attachments(self, message_ids: list[int]) -> dict[int, tuple[Attachment, ...]]:
        found: dict[int, list[Attachment]] = {}
        marks = ",".join("?" * len(message_ids))
        for message_id, kind, name, data, truncated in self._db.execute(
                f"SELECT message_id, kind, name, bytes, truncated FROM attachments WHERE "
                f"message_id IN ({marks}) ORDER BY message_id, position", message_ids):
            found.setdefault(message_id, []).append(
                Attachment(kind, name, bytes(data), bool(truncated)))
        return {key: tuple(value) for key, value in found.items()}

    # -- conversations ----------------------------------------------------------

    def create(self, title: str = "New chat", system_prompt: str = DEFAULT_SYSTEM_PROMPT,
               model: str | None = None) -> SavedConversation:
        now = time.time()
        with self._db:
            cursor = self._db.execute(
                "INSERT INTO conversations (title, system_prompt, model, updated) VALUES (?,?,?,?)",
                (title, system_prompt, model, now))
        return SavedConversation(cursor.lastrowid, title, system_prompt, model, False, now)

    def conversations(self, search: str = "") -> list[SavedConversation]:
        """Newest first; `search` matches titles and the words of any message."""
        words = re.findall(r"\w+", search)
        query = " ".join(f'"{word}"*' for word in words)  # each word, as a prefix
        rows = self._db.execute(
            "SELECT id, title, system_prompt, model, routed, updated, adapters FROM conversations "
            "WHERE deleted IS NULL AND (? = '' OR title LIKE ? OR (? != '' AND id IN ("
            "SELECT conversation_id FROM messages WHERE id IN ("
            "SELECT rowid FROM message_text WHERE message_text MATCH ?)))) "
            "ORDER BY updated DESC, id DESC",
            (search.strip(), f"%{search.strip()}%", query, query or '""'))
        return [_conversation(row) for row in rows]

    def get(self, conversation_id: int) -> SavedConversation:
        row = self._db.execute("SELECT id, title, system_prompt, model, routed, updated, "
                               "adapters FROM conversations WHERE id = ?", (conversation_id,)).fetchone()
        if row is None:
            raise KeyError(conversation_id)
        return _conversation(row)

    def update(self, conversation_id: int, **fields) -> None:
        allowed = {"title", "system_prompt", "model", "routed", "adapters"}
        if not fields.keys() <= allowed:
            raise ValueError(f"unknown fields: {set(fields) - allowed}")
        if "adapters" in fields:
            fields["adapters"] = json.dumps([[name, scale] for name, scale in fields["adapters"]])
        assignments = ", ".join(f"{name} = ?" for name in fields)
        with self._db:
            self._db.execute(f"UPDATE conversations SET {assignments}, updated = ? WHERE id = ?",
                             (*fields.values(), time.time(), conversation_id))

    def delete(self, conversation_id: int) -> None:
        """Mark it deleted: gone from the list, back with `restore` until the next start."""
        with self._db:
            self._db.execute("UPDATE conversations SET deleted = ? WHERE id = ?",
                             (time.time(), conversation_id))

    def restore(self, conversation_id: int) -> None:
        with self._db:
            self._db.execute("UPDATE conversations SET deleted = NULL WHERE id = ?",
                             (conversation_id,))

    def remove(self, conversation_ids: list[int]) -> None:
        """Delete these conversations for good, their messages with them (an import that
        could not finish takes back what it added)."""
        with self._db:
            self._db.executemany("DELETE FROM conversations WHERE id = ?",
                                 [(i,) for i in conversation_ids])

    def purge(self) -> None:
        with self._db:
            self._db.execute("DELETE FROM conversations WHERE deleted IS NOT NULL")

    # -- messages: the branch shown, and the others beside it -----------------------

    def messages(self, conversation_id: int) -> list[SavedMessage]:
        """The branch that ends at the conversation's tip, first message first."""
        rows = {row[0]: row for row in self._db.execute(
            f"SELECT {MESSAGE_COLUMNS} FROM messages WHERE conversation_id = ?",
            (conversation_id,))}
        siblings: dict[int | None, list[int]] = {}
        for key in sorted(rows):
            siblings.setdefault(rows[key][PARENT], []).append(key)
        branch, at = [], self._tip(conversation_id)
        while at in rows:
            family = siblings[rows[at][PARENT]]
            branch.append(SavedMessage(*rows[at],
                                       variant=(family.index(at) + 1, len(family))))
            at = rows[at][PARENT]
        attached = self._attachments([m.id for m in branch])
        return [replace(m, attachments=attached[m.id]) if m.id in attached else m
                for m in branch[::-1]]

    def add_message(self, conversation_id: int, role: str, content: str,
                    status: str = "complete", model: str | None = None,
                    detail: str = "", stats: str = "", reasoning: str = "",
                    thought_s: float | None = None, tools: list[dict] = (),
                    sources: list[dict] = (),
                    attachments: tuple[Attachment, ...] = ()) -> SavedMessage:
        """A message after the tip, which becomes the new tip; its attachments beside it."""
        parent = self._tip(conversation_id)
        tools_json = json.dumps(list(tools), ensure_ascii=False)
        sources_json = json.dumps(list(sources), ensure_ascii=False)
        with self._db:
            cursor = self._db.execute(
                "INSERT INTO messages (conversation_id, role, content, status, model, detail, "
                "stats, parent, reasoning, thought_s, tools, sources) "
                "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                (conversation_id, role, content, status, model, detail, stats, parent,
                 reasoning, thought_s, tools_json, sources_json))
            self._add_attachments(cursor.lastrowid, tuple(attachments))
            self._set_tip(conversation_id, cursor.lastrowid)
        return SavedMessage(cursor.lastrowid, role, content, status, model, detail, stats,
                            parent, reasoning, thought_s, tools_json, sources_json,
                            attachments=tuple(attachments))

    def rewind(self, conversation_id: int, message_id: int) -> None:
        """Make the tip the message before `message_id`: what is added next becomes its
        sibling (regenerate an answer, edit a question), and it stays one step away."""
        row = self._db.execute("SELECT parent FROM messages WHERE id = ? AND conversation_id = ?",
                               (message_id, conversation_id)).fetchone()
        if row is not None:
            with self._db:
                self._set_tip(conversation_id, row[0])

    def switch(self, conversation_id: int, message_id: int, step: int) -> None:
        """Show the sibling `step` away from `message_id` (‹ and ›), with the latest
        branch below it."""
        row = self._db.execute("SELECT parent FROM messages WHERE id = ? AND conversation_id = ?",
                               (message_id, conversation_id)).fetchone()
        if row is None:
            return
        family = self._children(conversation_id, row[0])
        chosen = family[(family.index(message_id) + step) % len(family)]
        while children := self._children(conversation_id, chosen):
            chosen = children[-1]
        with self._db:
            self._set_tip(conversation_id, chosen)

    def _children(self, conversation_id: int, parent: int | None) -> list[int]:
        return [row[0] for row in self._db.execute(
            "SELECT id FROM messages WHERE conversation_id = ? AND parent IS ? ORDER BY id",
            (conversation_id, parent))]

    def _tip(self, conversation_id: int) -> int | None:
        row = self._db.execute("SELECT tip FROM conversations WHERE id = ?",
                               (conversation_id,)).fetchone()
        return row[0] if row else None

    def _set_tip(self, conversation_id: int, tip: int | None) -> None:
        self._db.execute("UPDATE conversations SET tip = ?, updated = ? WHERE id = ?",
                         (tip, time.time(), conversation_id))

    def close(self) -> None:
        self._db.close()


def _list(text: str) -> list[dict]:
    """A JSON list column (a damaged one: empty)."""
    try:
        value = json.loads(text)
    except ValueError:
        return []
    return value if isinstance(value, list) else []


def _conversation(row: tuple) -> SavedConversation:
    *head, routed, updated, adapters = row
    return SavedConversation(*head, bool(routed), updated,
                             tuple((name, float(scale)) for name, scale in json.loads(adapters)))
