"""Whole answers to deterministic requests, kept on disk and replayed.

A request is deterministic when it samples greedily or with a seed. Its key is every
input that shapes the answer: the model file (fingerprint), the llama.cpp build, the
rendered prompt, sampling, stop sequences, max_tokens, tools, grammar. Exact matches
only: a similarity match answers "what is 12+5" with the answer to "what is 12+6"
(GPTCache #694), so two requests that differ anywhere never share an answer.

Entries live in SQLite (they survive a restart), bounded by size, least recently used
out first. The cache never fails a request: a corrupt file is set aside and started
anew, an unreadable entry is dropped, a full disk stops the writes; each is logged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import queue
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from .events import Delta, Event, Finished, GenerationRequest, Job, Started, Usage
from .llama.backend import build_id

log = logging.getLogger("homerack.response_cache")

SCHEMA = 1  # bumped when the key or the stored answer changes shape


@dataclass(frozen=True)
class Answer:
    """What a replay emits: the start, the text as it was streamed, how it ended."""
    started: Started
    pieces: tuple[str, ...]
    finish_reason: str
    completion_tokens: int

    def to_json(self) -> bytes:
        return json.dumps({"started": asdict(self.started), "pieces": self.pieces,
                           "finish_reason": self.finish_reason,
                           "completion_tokens": self.completion_tokens}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> "Answer":
        raw = json.loads(data)
        started = raw["started"]
        started["notes"] = tuple(started["notes"])
        started["adapters"] = tuple(started.get("adapters", ()))
        return cls(Started(**started), tuple(raw["pieces"]), raw["finish_reason"],
                   raw["completion_tokens"])


def deterministic(request: GenerationRequest) -> bool:
    return request.sampling.temperature <= 0 or request.sampling.seed is not None


def request_key(request: GenerationRequest, prompt: str, fingerprint: str, n_ctx: int,
                escalate_to: str | None = None, adapters: tuple = (),
                projector: str | None = None) -> str:
    """The key of everything that shapes the answer. `prompt`: the rendered prompt text
    (the same text always tokenizes alike with the same model file and build); `n_ctx`:
    the context the model is loaded with (an answer without max_tokens ends where it
    fills); `escalate_to`: the fingerprint of the cascade's large model; `adapters`: the
    LoRA adapters' (fingerprint, scale); `projector`: the fingerprint of the projector that
    sees the request's pictures."""
    inputs = {
        "schema": SCHEMA, "build": build_id(), "model": fingerprint, "prompt": prompt,
        "n_ctx": n_ctx,
        "raw": request.messages is None, "sampling": asdict(request.sampling),
        "stop": request.stop, "max_tokens": request.max_tokens,
        "ignore_eos": request.ignore_eos, "tools": request.tools,
        "grammar": request.grammar, "speculation": request.speculation,
        "cache_prompt": request.cache_prompt, "escalate_to": escalate_to,
        "escalate_below": request.escalate_below,
    }
    if adapters:  # absent for the model alone: keys stored before adapters stay valid
        inputs["adapters"] = list(adapters)
    if request.pictures:
        inputs["images"] = [p.digest for p in request.pictures]
        inputs["projector"] = projector
    if request.client is not None:  # a device's answers are its own (a hit would tell it
        inputs["client"] = request.client  # what the owner asked)
    return hashlib.sha256(json.dumps(inputs, sort_keys=True, default=str).encode()).hexdigest()


class ResponseCache:
    def __init__(self, path: Path, max_bytes: int):
        self.path, self.max_bytes = path, max_bytes
        self.stats = {"hits": 0, "misses": 0, "stores": 0, "evictions": 0, "dropped": 0,
                      "errors": 0}
        self.problem: str | None = None  # the last thing that went wrong, for status
        self._lock = threading.Lock()
        self._writes: queue.Queue = queue.Queue()
        self._unwritten: dict[str, tuple[bytes, str, str]] = {}  # queued puts, readable now
        self._current: set[tuple[str, str]] = set()  # (model path, fingerprint) whose older
        # versions' rows were deleted
        self._db = self._open()
        self._bytes = self._total() if self._db else 0
        threading.Thread(target=self._write_loop, name="homerack-answers", daemon=True).start()

    # -- reading (any thread) ---------------------------------------------------------

    def get(self, key: str, fingerprint: str, model_path: Path) -> Answer | None:
        if self._db is None:
            return None
        try:
            with self._lock:
                row = self._unwritten.get(key) or self._db.execute(
                    "SELECT body, digest, fingerprint FROM answers WHERE key = ?",
                    (key,)).fetchone()
        except sqlite3.Error as exc:
            self._trouble("read", exc)
            return None
        if row is None:
            self.stats["misses"] += 1
            version = (str(model_path), fingerprint)
            if version not in self._current:  # once per model file version and process
                self._current.add(version)
                self._writes.put(("forget_stale", *version))
            return None
        body, digest, stored_for = row
        try:
            if hashlib.sha256(body).hexdigest() != digest or stored_for != fingerprint:
                raise ValueError("checksum mismatch")
            answer = Answer.from_json(body)
        except (ValueError, KeyError, TypeError) as exc:
            log.warning("response cache: dropped an unreadable entry (%s)", exc)
            self.stats["dropped"] += 1
            self._writes.put(("drop", key))
            self.stats["misses"] += 1
            return None
        self.stats["hits"] += 1
        self._writes.put(("touch", key, time.time()))
        return answer

    def put(self, key: str, fingerprint: str, model_path: Path, answer: Answer) -> None:
        if self._db is not None:
            body = answer.to_json()
            with self._lock:
                self._unwritten[key] = (body, hashlib.sha256(body).hexdigest(), fingerprint)
            self._writes.put(("put", key, str(model_path), fingerprint, body))

    def flush(self, timeout: float = 10.0) -> None:
        """Wait for the writes queued so far (tests, shutdown)."""
        done = threading.Event()
        self._writes.put(("mark", done))
        done.wait(timeout)

    def close(self, timeout: float = 10.0) -> None:
        """The writes queued so far are made; then the writer thread ends (an engine
        closed in a process that goes on, as in the tests, left one behind each time)."""
        self.flush(timeout)
        self._writes.put(("stop",))

    def status(self) -> dict:
        return {"entries": self._count(), "bytes": self._bytes, "max_bytes": self.max_bytes,
                "path": str(self.path), "problem": self.problem, **self.stats}

    # -- the writer thread --------------------------------------------------------------

    def _write_loop(self) -> None:
        while True:
            op, *args = self._writes.get()
            if op == "stop":
                return
            if op == "mark":
                args[0].set()
                continue
            try:
                with self._lock:
                    getattr(self, f"_{op}")(*args)
                    self._db.commit()
            except sqlite3.Error as exc:
                self._rollback()
                self._trouble(op, exc)
            finally:
                if op == "put":
                    with self._lock:
                        self._unwritten.pop(args[0], None)

    def _put(self, key: str, model_path: str, fingerprint: str, body: bytes) -> None:
        if len(body) > self.max_bytes:
            return
        old = self._db.execute("SELECT length(body) FROM answers WHERE key = ?", (key,)).fetchone()
        self._db.execute(
            "INSERT OR REPLACE INTO answers (key, model_path, fingerprint, body, digest, used)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (key, model_path, fingerprint, body, hashlib.sha256(body).hexdigest(), time.time()))
        self._bytes += len(body) - (old[0] if old else 0)
        self.stats["stores"] += 1
        self._evict()

    def _evict(self) -> None:
        while self._bytes > self.max_bytes:
            key, size = self._db.execute(
                "SELECT key, length(body) FROM answers ORDER BY used LIMIT 1").fetchone()
            self._db.execute("DELETE FROM answers WHERE key = ?", (key,))
            self._bytes -= size
            self.stats["evictions"] += 1

    def _touch(self, key: str, when: float) -> None:
        self._db.execute("UPDATE answers SET used = ? WHERE key = ?", (when, key))

    def _drop(self, key: str) -> None:
        self._db.execute("DELETE FROM answers WHERE key = ?", (key,))
        self._bytes = self._total()

    def _forget_stale(self, model_path: str, fingerprint: str) -> None:
        """Answers of an earlier version of this model file can never be asked for again."""
        gone = self._db.execute("DELETE FROM answers WHERE model_path = ? AND fingerprint != ?",
                                (model_path, fingerprint)).rowcount
        if gone:
            self.stats["dropped"] += gone
            self._bytes = self._total()

    # -- the file -------------------------------------------------------------------

    def _open(self) -> sqlite3.Connection | None:
        """The database; a corrupt one is set aside and started anew; None when no file
        can be opened here at all (the cache is then off, requests unharmed)."""
        for attempt in range(2):
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                db = sqlite3.connect(self.path, check_same_thread=False, timeout=2)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")
                if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                    raise sqlite3.DatabaseError("quick_check failed")
                db.execute("CREATE TABLE IF NOT EXISTS answers (key TEXT PRIMARY KEY, "
                           "model_path TEXT, fingerprint TEXT, body BLOB, digest TEXT, used REAL)")
                db.execute("CREATE INDEX IF NOT EXISTS answers_used ON answers (used)")
                db.execute("CREATE INDEX IF NOT EXISTS answers_model ON answers (model_path)")
                db.commit()
                return db
            except (sqlite3.Error, OSError) as exc:
                self._trouble("open", exc)
                if attempt == 0:
                    self._set_aside()
        return None

    def _set_aside(self) -> None:
        for suffix in ("", "-wal", "-shm"):
            part = self.path.with_name(self.path.name + suffix)
            try:
                if part.exists():
                    part.replace(part.with_name(part.name + ".corrupt"))
            except OSError:
                pass

    def _total(self) -> int:
        with_lock = self._db.execute("SELECT COALESCE(SUM(length(body)), 0) FROM answers")
        return with_lock.fetchone()[0]

    def _count(self) -> int:
        if self._db is None:
            return 0
        try:
            with self._lock:
                return self._db.execute("SELECT COUNT(*) FROM answers").fetchone()[0]
        except sqlite3.Error:
            return 0

    def _rollback(self) -> None:
        try:
            self._db.rollback()
            self._bytes = self._total()
        except sqlite3.Error:
            pass

    def _trouble(self, what: str, exc: Exception) -> None:
        self.stats["errors"] += 1
        self.problem = f"{what}: {exc}"
        log.warning("response cache %s failed (%s); requests are served without it", what, exc)


class Recording:
    """A job's emit on its way to the client: marks the start with how the cache took part
    (and the route when the lane's Started carries none), and keeps a finished answer in
    `cache` under `key` (key, model fingerprint; None: not to be stored)."""

    def __init__(self, job: Job, cache: "ResponseCache | None", key: tuple[str, str] | None,
                 route: dict | None):
        self._emit, self._model, self._cache, self._key, self._route = \
            job.emit, job.request.model.path, cache, key, route
        self._mark = None if key is None else \
            ("bypass" if job.request.response_cache != "use" else "miss")
        self._started: Started | None = None
        self._pieces: list[str] = []

    def __call__(self, event: Event) -> None:
        if isinstance(event, Started):
            event = replace(event, response_cache=self._mark, route=event.route or self._route)
            self._started = event
        elif isinstance(event, Delta) and self._key:
            self._pieces.append(event.text)
        elif (isinstance(event, Finished) and self._key and self._started
              and event.finish_reason in ("stop", "length")):
            started = replace(self._started, route=None, response_cache=None)
            self._cache.put(*self._key, self._model, Answer(
                started, tuple(self._pieces), event.finish_reason, event.usage.completion_tokens))
        self._emit(event)


def replay(job: Job, answer: Answer, route: dict | None) -> None:
    """Emit a cached answer as the engine would have streamed it."""
    begun = time.perf_counter()
    if route:  # a cached cascade answer may be the large model's
        route = {**route, "model": answer.started.model}
    started = replace(answer.started, response_cache="hit", route=route)
    job.emit(started)
    for piece in answer.pieces:
        job.emit(Delta(piece))
    usage = Usage(prompt_tokens=started.prompt_tokens,
                  completion_tokens=answer.completion_tokens,
                  cached_tokens=started.prompt_tokens, queue_s=0.0,
                  time_to_first_token_s=round(time.perf_counter() - begun, 6),
                  prompt_tokens_per_s=0.0, decode_tokens_per_s=0.0, from_response_cache=True)
    job.emit(Finished(answer.finish_reason, usage))
