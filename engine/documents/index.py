"""The documents index in SQLite, beside the history and private like it: collections
(a name and its folders and files), each file's state (indexed at which size and time,
or why it could not be), and its passages with their place, their text under FTS5 (BM25)
and their embedding (float32). A file is replaced in one transaction, so an index stopped
midway (a crash, a restart) holds whole files only and goes on from there."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import InvalidRequest
from .chunking import Passage

SCHEMA = """
CREATE TABLE IF NOT EXISTS collections (
    name TEXT PRIMARY KEY, paths TEXT NOT NULL, model TEXT NOT NULL, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS files (
    id INTEGER PRIMARY KEY, collection TEXT NOT NULL REFERENCES collections(name)
        ON DELETE CASCADE,
    path TEXT NOT NULL, size INTEGER NOT NULL, mtime_ns INTEGER NOT NULL,
    state TEXT NOT NULL, error TEXT, passages INTEGER NOT NULL DEFAULT 0,
    UNIQUE (collection, path));
CREATE TABLE IF NOT EXISTS passages (
    id INTEGER PRIMARY KEY, file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    text TEXT NOT NULL, page INTEGER, start_line INTEGER NOT NULL, end_line INTEGER NOT NULL,
    heading TEXT NOT NULL, vector BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS passages_by_file ON passages(file_id);
CREATE VIRTUAL TABLE IF NOT EXISTS passage_text USING fts5(
    text, content='passages', content_rowid='id');
CREATE TRIGGER IF NOT EXISTS passage_text_add AFTER INSERT ON passages BEGIN
    INSERT INTO passage_text(rowid, text) VALUES (new.id, new.text); END;
CREATE TRIGGER IF NOT EXISTS passage_text_drop AFTER DELETE ON passages BEGIN
    INSERT INTO passage_text(passage_text, rowid, text) VALUES ('delete', old.id, old.text);
END;
"""


@dataclass(frozen=True)
class Found:
    """A passage as a search returns it."""
    id: int
    path: str
    text: str
    page: int | None
    start_line: int
    end_line: int
    heading: str

    def as_json(self, score: float) -> dict:
        place = {"page": self.page} if self.page is not None else \
            {"start_line": self.start_line, "end_line": self.end_line}
        return {"path": self.path, **place, "heading": self.heading, "text": self.text,
                "score": round(score, 6)}


class DocumentIndex:
    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._lock = threading.RLock()  # one connection, several threads
        with self._lock:
            self._db.execute("PRAGMA foreign_keys = ON")
            self._db.execute("PRAGMA journal_mode = WAL")
            self._db.executescript(SCHEMA)
        self._vectors: dict[str, tuple[int, np.ndarray, np.ndarray]] = {}
        self._version = 0

    # -- collections -----------------------------------------------------------------

    def add(self, name: str, paths: list[str], model: str) -> None:
        with self._lock, self._db:
            try:
                self._db.execute("INSERT INTO collections VALUES (?,?,?,?)",
                                 (name, json.dumps(paths), model, time.time()))
            except sqlite3.IntegrityError:
                raise InvalidRequest(f"a collection named {name!r} exists already",
                                     param="name") from None

    def remove(self, name: str) -> bool:
        with self._lock, self._db:
            self._bump()
            return self._db.execute("DELETE FROM collections WHERE name = ?",
                                    (name,)).rowcount > 0

    def collections(self) -> list[dict]:
        with self._lock:
            rows = self._db.execute(
                "SELECT c.name, c.paths, c.model, c.created, "
                "sum(f.state = 'done'), sum(f.state = 'failed'), coalesce(sum(f.passages), 0) "
                "FROM collections c LEFT JOIN files f ON f.collection = c.name "
                "GROUP BY c.name ORDER BY c.name").fetchall()
        return [{"name": n, "paths": json.loads(p), "model": m, "created": c,
                 "files_indexed": done or 0, "files_failed": failed or 0, "passages": count}
                for n, p, m, c, done, failed, count in rows]

    def collection(self, name: str) -> dict:
        found = next((c for c in self.collections() if c["name"] == name), None)
        if found is None:
            raise InvalidRequest(f"there is no collection named {name!r}", param="name")
        return found

    # -- files -------------------------------------------------------------------------

    def known(self, collection: str) -> dict[str, tuple[int, int, str]]:
        """Each file's (size, mtime_ns, state) as last indexed."""
        with self._lock:
            rows = self._db.execute("SELECT path, size, mtime_ns, state FROM files "
                                    "WHERE collection = ?", (collection,)).fetchall()
        return {path: (size, mtime, state) for path, size, mtime, state in rows}

    def failures(self, collection: str) -> list[dict]:
        with self._lock:
            rows = self._db.execute("SELECT path, error FROM files WHERE collection = ? AND "
                                    "state = 'failed' ORDER BY path", (collection,)).fetchall()
        return [{"path": path, "error": error} for path, error in rows]

    def put(self, collection: str, path: str, size: int, mtime_ns: int,
            passages: list[Passage], vectors: np.ndarray) -> None:
        """The file's passages, replacing what it had, in one transaction."""
        with self._lock, self._db:
            file_id = self._file(collection, path, size, mtime_ns, "done", None, len(passages))
            self._db.executemany(
                "INSERT INTO passages (file_id, text, page, start_line, end_line, heading, "
                "vector) VALUES (?,?,?,?,?,?,?)",
                [(file_id, p.text, p.page, p.start_line, p.end_line, p.heading,
                  np.asarray(v, dtype=np.float32).tobytes()) for p, v in zip(passages, vectors)])
            self._bump()

    def fail(self, collection: str, path: str, size: int, mtime_ns: int, error: str) -> None:
        with self._lock, self._db:
            self._file(collection, path, size, mtime_ns, "failed", error, 0)
            self._bump()

    def forget(self, collection: str, path: str) -> None:
        with self._lock, self._db:
            self._db.execute("DELETE FROM files WHERE collection = ? AND path = ?",
                             (collection, path))
            self._bump()

    def _file(self, collection, path, size, mtime_ns, state, error, count) -> int:
        self._db.execute("DELETE FROM files WHERE collection = ? AND path = ?",
                         (collection, path))
        return self._db.execute(
            "INSERT INTO files (collection, path, size, mtime_ns, state, error, passages) "
            "VALUES (?,?,?,?,?,?,?)",
            (collection, path, size, mtime_ns, state, error, count)).lastrowid

    def _bump(self) -> None:
        self._version += 1

    # -- search ------------------------------------------------------------------------

    def keyword(self, collection: str, query: str, limit: int) -> list[int]:
        """Passage ids by BM25 (FTS5), best first; the query's words, each quoted."""
        words = ['"' + w.replace('"', '""') + '"' for w in query.split() if w.strip()][:64]
        if not words:
            return []
        with self._lock:
            rows = self._db.execute(
                "SELECT p.id FROM passage_text JOIN passages p ON p.id = passage_text.rowid "
                "JOIN files f ON f.id = p.file_id WHERE passage_text MATCH ? AND "
                "f.collection = ? ORDER BY bm25(passage_text) LIMIT ?",
                (" OR ".join(words), collection, limit)).fetchall()
        return [row[0] for row in rows]

    def similar(self, collection: str, vector: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every passage's id (ascending) and its dot product with `vector` (normalised
        vectors: the cosine): exact, over float32, as GPT4All's LocalDocs does."""
        ids, matrix = self._matrix(collection)
        if not len(ids):
            return ids, np.zeros(0, dtype=np.float32)
        return ids, matrix @ np.asarray(vector, dtype=np.float32)

    def _matrix(self, collection: str) -> tuple[np.ndarray, np.ndarray]:
        held = self._vectors.get(collection)
        if held and held[0] == self._version:
            return held[1], held[2]
        with self._lock:
            rows = self._db.execute(
                "SELECT p.id, p.vector FROM passages p JOIN files f ON f.id = p.file_id "
                "WHERE f.collection = ? ORDER BY p.id", (collection,)).fetchall()
        ids = np.array([r[0] for r in rows], dtype=np.int64)
        matrix = np.stack([np.frombuffer(r[1], dtype=np.float32) for r in rows]) if rows \
            else np.zeros((0, 1), dtype=np.float32)
        self._vectors[collection] = (self._version, ids, matrix)
        return ids, matrix

    def passages(self, ids: list[int]) -> dict[int, Found]:
        if not ids:
            return {}
        marks = ",".join("?" * len(ids))
        with self._lock:
            rows = self._db.execute(
                "SELECT p.id, f.path, p.text, p.page, p.start_line, p.end_line, p.heading "
                f"FROM passages p JOIN files f ON f.id = p.file_id WHERE p.id IN ({marks})",
                ids).fetchall()
        return {row[0]: Found(*row) for row in rows}

    def file_text(self, collection: str, path: str) -> str:
        """A file's passages joined in order: its whole text as indexed."""
        with self._lock:
            rows = self._db.execute(
                "SELECT p.text FROM passages p JOIN files f ON f.id = p.file_id "
                "WHERE f.collection = ? AND f.path = ? ORDER BY p.id",
                (collection, path)).fetchall()
        return "\n".join(row[0] for row in rows)

    def size_bytes(self) -> int:
        return sum(p.stat().st_size for p in self.path.parent.glob(self.path.name + "*")
                   if p.exists())

    def close(self) -> None:
        with self._lock:
            self._db.close()
