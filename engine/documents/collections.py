"""Collections of the user's documents, indexed in the engine's background: a worker
thread reads each new or changed file, cuts it into passages, embeds them in batches and
stores them (index.py); on start it goes on from where it stopped; watchdog tells it of
files changed, added or deleted; progress (files, passages, time left) is kept for the
app and the API. Search is hybrid: BM25 and embeddings fused by reciprocal rank. The
routes reach it as `engine.documents`."""

from __future__ import annotations

import logging
import os
import queue
import re
import stat
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import InvalidRequest
from .chunking import passages
from .index import DocumentIndex
from .reading import SUFFIXES, Unreadable, read_lines

log = logging.getLogger("homerack")
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 _.-]{0,63}$")
MAX_QUERY_CHARS = 4000
MAX_FILES = 200_000  # of one collection: a whole disk named by mistake stops there
BATCH = 32           # passages embedded at once
RRF_K = 60           # reciprocal rank fusion's constant (Cormack et al.)
QUIET_S = 1.0        # after a change, the quiet time before the collection is looked at
RERANKED = 20        # candidates of the fused ranking a reranker orders again
# models that were trained with prefixes on queries and passages
PREFIXES = (("nomic", "search_query: ", "search_document: "), ("e5", "query: ", "passage: "),
            ("bge", "Represent this sentence for searching relevant passages: ", ""))


@dataclass
class Progress:
    files_total: int = 0
    files_done: int = 0
    passages: int = 0
    started: float = 0.0
    state: str = "queued"  # queued, indexing, ready

    def as_json(self) -> dict:
        rate = self.files_done / (time.monotonic() - self.started) \
            if self.started and self.files_done else 0
        left = (self.files_total - self.files_done) / rate if rate else None
        return {"state": self.state, "files_total": self.files_total,
                "files_done": self.files_done, "passages_added": self.passages,
                "seconds_left": round(left, 1) if left is not None else None}


@dataclass
class Embedding:
    """How passages become vectors: the embedding model's id, its batch embedder and its
    token counter (its own vocabulary)."""
    model: str
    embed: Callable[..., np.ndarray]  # (texts, truncate=False): cut to the context
    count: Callable[[str], int]
    rank: Callable[[str, str, list[str]], np.ndarray]  # (reranker id, query, passages)
    prefixes: tuple[str, str] = field(init=False)

    def __post_init__(self):
        self.prefixes = next(((q, d) for key, q, d in PREFIXES if key in self.model.lower()),
                             ("", ""))


class Collections:
    def __init__(self, path: Path, embedding: Callable[[str | None], Embedding]):
        self.index = DocumentIndex(path)
        # a model id (None: the starter) to its Embedding; the model loads when first used
        self._embedding = embedding
        self._progress: dict[str, Progress] = {}
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._observer = None
        self._pending: dict[str, threading.Timer] = {}  # changes waiting for quiet
        self._watches: dict[str, list] = {}  # watchdog's (handler, watch), by collection
        self._worker = threading.Thread(target=self._work, name="homerack-documents",
                                        daemon=True)
        self._worker.start()
        for collection in self.index.collections():  # a restart goes on where it stopped
            self.schedule(collection["name"])
            self._watch(collection["name"], collection["paths"])

    # -- for the routes -------------------------------------------------------------

    def add(self, name: str, paths: list[str], model: str | None = None) -> dict:
        if not isinstance(name, str) or not NAME.match(name):
            raise InvalidRequest("name: 1-64 letters, digits, spaces, _ . or -, starting "
                                 "with a letter or digit", param="name")
        if not paths:
            raise InvalidRequest("paths: name at least one folder or file", param="paths")
        chosen = []
        for i, given in enumerate(paths):
            path = Path(os.path.expanduser(given))
            if not path.is_absolute():
                raise InvalidRequest(f"paths[{i}]: {given!r} is not an absolute path",
                                     param=f"paths[{i}]")
            if not path.exists():
                raise InvalidRequest(f"paths[{i}]: {given} does not exist", param=f"paths[{i}]")
            if not os.access(path, os.R_OK):
                raise InvalidRequest(f"paths[{i}]: {given} cannot be read", param=f"paths[{i}]")
            chosen.append(str(path.resolve()))
        self.index.add(name, chosen, self._embedding(model).model)
        self.schedule(name)
        self._watch(name, chosen)
        return self.status(name)

    def remove(self, name: str) -> None:
        if not self.index.remove(name):
            raise InvalidRequest(f"there is no collection named {name!r}", param="name")
        self._progress.pop(name, None)
        held = self._pending.pop(name, None)
        if held:
            held.cancel()
        for handler, watch in self._watches.pop(name, ()):  # another may watch the folder
            self._observer.remove_handler_for_watch(handler, watch)

    def status(self, name: str | None = None) -> dict | list[dict]:
        listed = [{**c, **(self._progress[c["name"]].as_json() if c["name"] in self._progress
                           else {"state": "ready"})} for c in self.index.collections()]
        if name is None:
            return listed
        found = next((c for c in listed if c["name"] == name), None)
        if found is None:
            raise InvalidRequest(f"there is no collection named {name!r}", param="name")
        return {**found, "failed": self.index.failures(name)}

    def search(self, name: str, query: str, top_k: int = 5, mode: str = "hybrid",
               reranker: str | None = None, cut: bool = False) -> list[dict]:
        """Passages best first. `mode`: "hybrid" (BM25 and embeddings fused by reciprocal
        rank), or one of them alone ("keyword", "embedding": what the benchmark compares).
        `reranker`: a reranker's id, which orders the first candidates again. `cut`: a
        query longer than the embedder reads is cut to it (else a 400 says so)."""
        collection = self.index.collection(name)  # a 400 naming it when there is none
        if not isinstance(query, str) or not query.strip():
            raise InvalidRequest("query is empty", param="query")
        if len(query) > MAX_QUERY_CHARS:
            raise InvalidRequest(f"query is {len(query):,} characters; at most "
                                 f"{MAX_QUERY_CHARS:,}", param="query")
        top_k = max(1, min(int(top_k), 50))
        embedding = self._embedding(collection["model"])
        wide = max(top_k * 4, 20)
        by_words = self.index.keyword(name, query, wide)
        vector = embedding.embed([embedding.prefixes[0] + query], truncate=cut)[0]
        ids, similarity = self.index.similar(name, vector)
        by_meaning = [int(ids[i]) for i in np.argsort(-similarity)[:wide]]
        scores: dict[int, float] = {}
        lists = {"hybrid": (by_words, by_meaning), "keyword": (by_words,),
                 "embedding": (by_meaning,)}[mode]
        for ranked in lists:
            for rank, passage_id in enumerate(ranked):
                scores[passage_id] = scores.get(passage_id, 0.0) + 1.0 / (RRF_K + rank + 1)
        best = sorted(scores, key=scores.get, reverse=True)[:RERANKED if reranker else top_k]
        found = self.index.passages(best)
        if reranker:
            best = [i for i in best if i in found]
            ranked = embedding.rank(reranker, query, [found[i].text for i in best])
            scores = dict(zip(best, map(float, ranked)))
            best = sorted(best, key=scores.get, reverse=True)[:top_k]
        cosine = similarity[np.searchsorted(ids, best)] if len(ids) else np.zeros(len(best))
        return [{**found[i].as_json(scores[i]), "similarity": round(float(c), 4),
                 "collection": name} for i, c in zip(best, cosine) if i in found]

    def file_text(self, name: str, path: str) -> str:
        """A file of collection `name`, its whole text as indexed (a short file is given
        to a grounded answer whole)."""
        return self.index.file_text(name, path)

    def schedule(self, name: str) -> None:
        self._progress.setdefault(name, Progress())
        self._queue.put(name)

    def _watch(self, name: str, paths: list[str]) -> None:
        """watchdog reports changes under the collection's paths: after a quiet second the
        collection is looked at again (only what changed is read)."""
        from watchdog.events import FileSystemEventHandler
        from watchdog.observers import Observer

        documents = self

        class Changed(FileSystemEventHandler):
            def on_any_event(self, event):
                if not event.is_directory or event.event_type in ("deleted", "moved"):
                    documents._changed(name)

        if self._observer is None:
            self._observer = Observer()
            self._observer.daemon = True
            self._observer.start()
        for path in paths:
            folder = path if Path(path).is_dir() else str(Path(path).parent)
            try:
                handler = Changed()
                self._watches.setdefault(name, []).append(
                    (handler, self._observer.schedule(handler, folder, recursive=True)))
            except OSError as exc:  # too many watches, a folder gone: the next look finds it
                log.warning("cannot watch %s: %s", folder, exc)

    def _changed(self, name: str) -> None:
        if name not in self._watches:  # removed since the event was sent
            return
        held = self._pending.pop(name, None)
        if held:
            held.cancel()
        timer = self._pending[name] = threading.Timer(QUIET_S, self.schedule, (name,))
        timer.daemon = True
        timer.start()

    def close(self) -> None:
        if self._observer is not None:
            self._observer.stop()
        for timer in self._pending.values():
            timer.cancel()
        self._queue.put(None)
        self._worker.join(10)
        self.index.close()

    # -- the worker ----------------------------------------------------------------------

    def _work(self) -> None:
        while (name := self._queue.get()) is not None:
            try:
                self._index(name)
            except Exception:  # noqa: BLE001 - one collection's failure stops none other
                log.exception("indexing %s failed", name)
                if name in self._progress:
                    self._progress[name].state = "failed"

    def _index(self, name: str) -> None:
        try:
            collection = self.index.collection(name)
        except InvalidRequest:  # removed meanwhile
            return
        progress = self._progress.setdefault(name, Progress())
        files = _files(collection["paths"])
        known = self.index.known(name)
        for gone in set(known) - set(files):
            self.index.forget(name, gone)
        todo = [(path, stat) for path, stat in files.items()
                if known.get(path, (None, None, None))[:2] != stat]
        progress.files_total, progress.files_done = len(todo), 0
        progress.started, progress.state = time.monotonic(), "indexing"
        embedding = self._embedding(collection["model"]) if todo else None
        for path, (size, mtime_ns) in todo:
            if name not in self._progress:  # removed while indexing
                return
            self._index_file(name, path, size, mtime_ns, embedding, progress)
            progress.files_done += 1
        progress.state = "ready"

    def _index_file(self, name: str, path: str, size: int, mtime_ns: int,
                    embedding: Embedding, progress: Progress) -> None:
        try:
            found = passages(read_lines(Path(path)), embedding.count)
            prefix = embedding.prefixes[1]
            vectors = [embedding.embed([prefix + p.text for p in found[i:i + BATCH]])
                       for i in range(0, len(found), BATCH)]
            stacked = np.concatenate(vectors) if vectors else np.zeros((0, 1), np.float32)
        except Unreadable as exc:
            self.index.fail(name, path, size, mtime_ns, str(exc))
            return
        except InvalidRequest as exc:  # the embedder refused a passage: said, not fatal
            self.index.fail(name, path, size, mtime_ns, exc.message)
            return
        self.index.put(name, path, size, mtime_ns, found, stacked)
        progress.passages += len(found)


def _files(paths: list[str]) -> dict[str, tuple[int, int]]:
    """Every indexable file under the collection's paths: (size, mtime_ns) by path. Only
    regular files whose real place lies under the root they were found from: no link is
    followed (out of the folder or within it), no FIFO, socket or device is listed.
    Hidden folders (.git, .venv) are skipped."""
    out: dict[str, tuple[int, int]] = {}
    for root in paths:
        start, real_root = Path(root), os.path.realpath(root)
        candidates = [start] if start.is_file() else _walk(start)
        for path in candidates:
            if path.suffix.lower() not in SUFFIXES:
                continue
            try:
                found = os.lstat(path)  # the entry itself, never what a link names
            except OSError:
                continue
            if not stat.S_ISREG(found.st_mode) or not _under(path, real_root):
                continue
            out[str(path)] = (found.st_size, found.st_mtime_ns)
            if len(out) >= MAX_FILES:
                return out
    return out


def _under(path: Path, real_root: str) -> bool:
    """Whether `path`'s real place is `real_root` (resolved) or lies under it (a folder on
    the way may have been swapped for a link since the walk passed it)."""
    try:
        return os.path.commonpath([os.path.realpath(path), real_root]) == real_root
    except ValueError:
        return False


def _walk(folder: Path):
    for directory, folders, names in os.walk(folder):  # links to folders are not entered
        folders[:] = sorted(f for f in folders if not f.startswith("."))
        for name in sorted(names):
            if not name.startswith("."):
                yield Path(directory) / name
