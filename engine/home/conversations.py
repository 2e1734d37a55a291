"""Each paired device's conversations in the web chat, in one private SQLite file.

Every read and write names the device: a conversation of another device is as absent
as one that never was (404, not 403: its existence is not told either). A message's
picture is a row of `attachments` (kind, name, sha256, bytes), read back by its hash:
kept as the file the phone sent, never as text (version 0 kept data URLs in
`messages.picture`: migrated once, in place, under PRAGMA user_version).
"""

from __future__ import annotations

import base64
import hashlib
import os
import secrets
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import InvalidRequest, NotFound

VERSION = 1  # PRAGMA user_version: 1, pictures as attachments

MAX_CONVERSATIONS = 500  # per device; the oldest beyond it are dropped
MAX_TITLE = 120
# What one device may keep here: its messages' text and pictures (a phone's photo as a
# data URL is up to 12 MB), and their number.
MAX_DEVICE_BYTES = 256 << 20
MAX_DEVICE_MESSAGES = 20_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY, device TEXT NOT NULL, title TEXT NOT NULL, model TEXT,
    created REAL NOT NULL, updated REAL NOT NULL);
CREATE INDEX IF NOT EXISTS by_device ON conversations (device, updated);
CREATE TABLE IF NOT EXISTS messages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    conversation TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    role TEXT NOT NULL, content TEXT NOT NULL, reasoning TEXT NOT NULL DEFAULT '',
    finish TEXT, created REAL NOT NULL);
CREATE INDEX IF NOT EXISTS by_conversation ON messages (conversation, id);
CREATE TABLE IF NOT EXISTS attachments (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    message INTEGER NOT NULL REFERENCES messages (id) ON DELETE CASCADE,
    kind TEXT NOT NULL, name TEXT NOT NULL, sha256 TEXT NOT NULL, bytes BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS by_message ON attachments (message);
"""


@dataclass(frozen=True)
class Attachment:
    """A file kept with a message: its kind ("picture"), name, hash and bytes."""
    kind: str
    name: str
    sha256: str
    data: bytes


class Conversations:
    def __init__(self, path: Path | None):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            path.touch(mode=0o600, exist_ok=True)
            os.chmod(path, 0o600)
        self._db = sqlite3.connect(str(path) if path else ":memory:", check_same_thread=False,
                                   isolation_level=None)
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.executescript(SCHEMA)
        if self._db.execute("PRAGMA user_version").fetchone()[0] < VERSION:
            _migrate(self._db)
        self._lock = threading.Lock()

    def _rows(self, sql: str, *args) -> list[tuple]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def listed(self, device: str) -> list[dict]:
        return [{"id": i, "title": t, "model": m, "updated": u} for i, t, m, u in self._rows(
            "SELECT id, title, model, updated FROM conversations WHERE device = ? "
            "ORDER BY updated DESC", device)]

    def create(self, device: str, title: str = "New chat") -> dict:
        conv_id, now = secrets.token_hex(8), time.time()
        with self._lock:
            self._db.execute("INSERT INTO conversations VALUES (?, ?, ?, NULL, ?, ?)",
                             (conv_id, device, _title(title), now, now))
            self._db.execute(
                "DELETE FROM conversations WHERE device = ? AND id NOT IN (SELECT id FROM "
                "conversations WHERE device = ? ORDER BY updated DESC LIMIT ?)",
                (device, device, MAX_CONVERSATIONS))
        return {"id": conv_id, "title": _title(title), "model": None, "updated": now}

    def get(self, device: str, conv_id: str) -> dict:
        found = self._rows("SELECT id, title, model, updated FROM conversations "
                           "WHERE id = ? AND device = ?", conv_id, device)
        if not found:
            raise NotFound("no such conversation", param="conversation")
        conv_id, title, model, updated = found[0]
        messages = [{"id": i, "role": r, "content": c, "reasoning": t, "picture": p,
                     "finish": f} for i, r, c, t, p, f in self._rows(
            "SELECT messages.id, role, content, reasoning, sha256, finish FROM messages "
            "LEFT JOIN attachments ON attachments.message = messages.id "
            "WHERE conversation = ? ORDER BY messages.id", conv_id)]
        return {"id": conv_id, "title": title, "model": model, "updated": updated,
                "messages": messages}

    def attachment(self, device: str, conv_id: str, sha256: str) -> Attachment:
        """A file of the device's conversation, by its hash (`picture` in `get`)."""
        found = self._rows(
            "SELECT kind, name, sha256, bytes FROM attachments JOIN messages ON messages.id "
            "= attachments.message JOIN conversations ON conversations.id = "
            "messages.conversation WHERE conversations.id = ? AND device = ? AND sha256 = ? "
            "LIMIT 1", conv_id, device, sha256)
        if not found:
            raise NotFound("no such attachment in this conversation", param="attachment")
        return Attachment(*found[0])

    def rename(self, device: str, conv_id: str, title) -> None:
        self._change(device, conv_id, "title = ?", _title(title))

    def delete(self, device: str, conv_id: str) -> None:
        self.get(device, conv_id)
        with self._lock:
            self._db.execute("DELETE FROM conversations WHERE id = ?", (conv_id,))

    def forget_device(self, device: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM conversations WHERE device = ?", (device,))

    def add(self, device: str, conv_id: str, role: str, content: str,
            picture: Attachment | None = None, model: str | None = None) -> int:
        self.get(device, conv_id)
        adding = len(content.encode()) + (len(picture.data) if picture else 0)
        with self._lock:
            count, used = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(LENGTH(CAST(content AS BLOB))), 0) + "
                "(SELECT COALESCE(SUM(LENGTH(bytes)), 0) FROM attachments JOIN messages ON "
                "messages.id = attachments.message JOIN conversations ON conversations.id "
                "= messages.conversation WHERE device = ?1) FROM messages JOIN "
                "conversations ON conversations.id = messages.conversation WHERE device = ?1",
                (device,)).fetchone()
            if count >= MAX_DEVICE_MESSAGES or used + adding > MAX_DEVICE_BYTES:
                raise InvalidRequest(
                    f"this device keeps {count:,} messages ({used / 2**20:.0f} MiB) here, its "
                    f"most ({MAX_DEVICE_MESSAGES:,}, {MAX_DEVICE_BYTES >> 20} MiB): delete "
                    "some conversations first", param="content")
            with self._db:  # the message and its picture, or neither
                self._db.execute("BEGIN")
                cursor = self._db.execute(
                    "INSERT INTO messages (conversation, role, content, created) "
                    "VALUES (?, ?, ?, ?)", (conv_id, role, content, time.time()))
                if picture is not None:
                    _attach(self._db, cursor.lastrowid, picture)
        if model:
            self._change(device, conv_id, "model = ?", model)
        else:
            self._change(device, conv_id, "title = title")
        return cursor.lastrowid

    def finish(self, message_id: int, content: str, reasoning: str, finish: str) -> None:
        with self._lock:
            self._db.execute("UPDATE messages SET content = ?, reasoning = ?, finish = ? "
                             "WHERE id = ?", (content, reasoning, finish, message_id))

    def _change(self, device: str, conv_id: str, assignment: str, *values) -> None:
        with self._lock:
            changed = self._db.execute(
                f"UPDATE conversations SET {assignment}, updated = ? WHERE id = ? AND "
                "device = ?", (*values, time.time(), conv_id, device)).rowcount
        if not changed:
            raise NotFound("no such conversation", param="conversation")


def _title(title) -> str:
    if not isinstance(title, str) or not title.strip():
        raise InvalidRequest("title: some words", param="title")
    return " ".join(title.split())[:MAX_TITLE]


def _attach(db, message: int, file: Attachment) -> None:
    db.execute("INSERT INTO attachments (message, kind, name, sha256, bytes) "
               "VALUES (?, ?, ?, ?, ?)", (message, file.kind, file.name, file.sha256, file.data))


def _migrate(db) -> None:
    """Version 0's pictures (data URLs in `messages.picture`, validated when they came)
    into attachments, the column dropped; all of it, or nothing."""
    with db:
        db.execute("BEGIN")
        columns = {row[1] for row in db.execute("PRAGMA table_info(messages)")}
        if "picture" in columns:
            for message, url in db.execute("SELECT id, picture FROM messages "
                                           "WHERE picture IS NOT NULL").fetchall():
                _attach(db, message, _from_data_url(url))
            db.execute("ALTER TABLE messages DROP COLUMN picture")
        db.execute(f"PRAGMA user_version = {VERSION}")


def _from_data_url(url: str) -> Attachment:
    head, _, data = url.partition(",")
    kind = head[5:].split(";")[0] or "image/png"  # data:image/jpeg;base64
    raw = base64.b64decode(data)
    return Attachment("picture", f"picture.{kind.split('/')[-1]}", hashlib.sha256(raw).hexdigest(),
                      raw)
