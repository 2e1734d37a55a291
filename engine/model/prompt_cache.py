"""Saved KV states of token sequences, reused by the longest matching prefix.

Two tiers hold the same kind of entry (the tokens a state covers, and the state bytes
from llama.cpp's per-sequence state API): RAM, bounded by bytes, and a disk folder that
survives restarts, bounded by bytes too; both evict the least recently used. Lookup
does not scan entries: every entry is indexed under chained hashes of its token prefix
at each block boundary (as in vLLM's prefix caching), so finding the longest cached
prefix of a prompt costs one dictionary probe per block of the prompt.

A disk file carries the model fingerprint, the llama.cpp build and a CRC-32 of the
state; a file that does not match, or is damaged, is deleted and never loaded. The
check guards against damage (a torn write, a bad sector), not forgery: the folder is the
user's own (0700), and whoever can write there can write any checksum. CRC-32 runs at
memory speed on every CPU; a sha256 of a 41 MB state took 22 ms here and several times
that on CPUs without SHA instructions, on the path of the first token.
"""

from __future__ import annotations

import array
import json
import logging
import os
import queue
import struct
import threading
import time
import uuid
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from ..prefix import common_prefix
from ..settings import BLOCK, CacheLimits

log = logging.getLogger(__name__)

MAGIC = b"HRKVSTAT"
FORMAT = 2  # 2: CRC-32 instead of sha256
_HEAD = struct.Struct("<8sII")  # magic, format, header length


def prefix_hashes(tokens, salt: str) -> list[int]:
    """Chained hashes of the prefixes tokens[:BLOCK], tokens[:2*BLOCK], ..."""
    out, h = [], hash(salt)
    for start in range(0, len(tokens) - BLOCK + 1, BLOCK):
        h = hash((h, tuple(tokens[start:start + BLOCK])))
        out.append(h)
    return out


@dataclass(eq=False)
class Entry:
    key: str
    tokens: tuple[int, ...]
    size: int
    state: bytearray | None = None  # in RAM
    path: Path | None = None        # on disk
    pending: bool = False           # a disk write is queued
    salt: str = ""                  # what else the state depends on (LoRA adapters)
    last_used: float = field(default_factory=time.monotonic)
    written: float = 0.0            # when its file was written (time.time(), its mtime)


@dataclass(frozen=True)
class Hit:
    entry: Entry
    length: int  # tokens of the prompt the entry covers


class PromptCache:
    def __init__(self, fingerprint: str, build: str, folder: Path | None, limits: CacheLimits):
        self.fingerprint, self.build, self.limits = fingerprint, build, limits
        self.folder = folder / fingerprint[:32] if folder else None
        self._entries: dict[str, Entry] = {}
        self._index: dict[int, set[str]] = {}
        self._lock = threading.RLock()
        self._writes: queue.Queue = queue.Queue()
        self.stats = {"hits_ram": 0, "hits_disk": 0, "rejected_files": 0}
        if self.folder:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._scan()
            threading.Thread(target=self._write_loop, name="homerack-kv-writer",
                             daemon=True).start()

    # -- lookup -------------------------------------------------------------------

    def best(self, prompt: list[int], salt: str = "") -> Hit | None:
        """The entry covering the longest prefix of the prompt, if long enough, among
        those saved with the same salt (states computed under the same adapters)."""
        with self._lock:
            hashes = prefix_hashes(prompt, self.fingerprint + salt)
            for depth in range(len(hashes) - 1, -1, -1):
                keys = [k for k in self._index.get(hashes[depth], ())
                        if self._entries[k].salt == salt]
                if keys:
                    hits = [Hit(self._entries[k], common_prefix(self._entries[k].tokens, prompt))
                            for k in keys]
                    hit = max(hits, key=lambda h: (h.length, h.entry.state is not None))
                    return hit if hit.length >= self.limits.min_tokens else None
        return None

    def fetch(self, hit: Hit) -> bytearray | None:
        """The entry's state, from RAM or from a verified disk file."""
        entry = hit.entry
        with self._lock:
            entry.last_used = time.monotonic()
            if entry.state is not None:
                self.stats["hits_ram"] += 1
                return entry.state
            path = entry.path
        state = self._read_verified(path) if path else None
        with self._lock:
            if state is None:
                self._drop_file(entry)
                return None
            self.stats["hits_disk"] += 1
            os.utime(path)  # recency for disk eviction
            entry.state = state
            self._evict_ram()
            return state

    # -- saving ---------------------------------------------------------------------

    def save(self, tokens: list[int], state: bytearray, salt: str = "") -> None:
        """Keep the state of `tokens`; entries it extends become redundant."""
        tokens = tuple(tokens)
        if len(tokens) < self.limits.min_tokens or len(state) > self.limits.ram_bytes:
            return
        with self._lock:
            for old in self._prefixes_of(tokens, salt):
                self._remove(old)
            entry = Entry(uuid.uuid4().hex, tokens, len(state), state=state,
                          pending=self.folder is not None, salt=salt)
            self._add(entry)
            self._evict_ram()
        if self.folder:
            self._writes.put((entry, state))

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until background disk writes are done (tests, shutdown)."""
        deadline = time.monotonic() + timeout
        while self._writes.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def close(self, timeout: float = 30.0) -> None:
        """Writes under way finish, then the writer thread ends and the RAM tier is let
        go: a model unloaded and loaded again gets a new cache, and the old one's thread
        would otherwise hold it, and every state in RAM, for the life of the process."""
        self.flush(timeout)
        if self.folder:
            self._writes.put(None)
        with self._lock:
            self._entries.clear()
            self._index.clear()

    def ram_bytes(self) -> int:
        with self._lock:
            return sum(e.size for e in self._entries.values() if e.state is not None)

    def disk_bytes(self) -> int:
        with self._lock:
            return sum(e.size for e in self._entries.values() if e.path is not None)

    def entries(self) -> list[Entry]:
        with self._lock:
            return list(self._entries.values())

    # -- bookkeeping ----------------------------------------------------------------

    def _prefixes_of(self, tokens: tuple[int, ...], salt: str) -> list[Entry]:
        candidates = set()
        for h in prefix_hashes(tokens, self.fingerprint + salt):
            candidates |= self._index.get(h, set())
        return [self._entries[k] for k in candidates
                if len(self._entries[k].tokens) <= len(tokens) and self._entries[k].salt == salt
                and tokens[:len(self._entries[k].tokens)] == self._entries[k].tokens]

    def _add(self, entry: Entry) -> None:
        self._entries[entry.key] = entry
        for h in prefix_hashes(entry.tokens, self.fingerprint + entry.salt):
            self._index.setdefault(h, set()).add(entry.key)

    def _remove(self, entry: Entry) -> None:
        if self._entries.pop(entry.key, None) is None:
            return
        for h in prefix_hashes(entry.tokens, self.fingerprint + entry.salt):
            keys = self._index.get(h)
            if keys:
                keys.discard(entry.key)
                if not keys:
                    del self._index[h]
        if entry.path:
            entry.path.unlink(missing_ok=True)
            entry.path = None
        entry.state = None

    def _evict_ram(self) -> None:
        in_ram = sorted((e for e in self._entries.values() if e.state is not None),
                        key=lambda e: e.last_used)
        total = sum(e.size for e in in_ram)
        for entry in in_ram:
            if total <= self.limits.ram_bytes:
                break
            total -= entry.size
            entry.state = None
            if entry.path is None and not entry.pending:
                self._remove(entry)

    def _evict_disk(self) -> None:
        """The oldest files go while the tier is over its budget: known from the entries,
        no file asked (a stat of every file at each write was 4% of a 2-core machine's
        time while sixteen conversations ran, with the tier full)."""
        on_disk = [e for e in self._entries.values() if e.path is not None]
        total = sum(e.size for e in on_disk)
        if total <= self.limits.disk_bytes:
            return
        for entry in sorted(on_disk, key=lambda e: e.written):
            if total <= self.limits.disk_bytes:
                break
            total -= entry.size
            self._drop_file(entry)

    def _drop_file(self, entry: Entry) -> None:
        if entry.path:
            entry.path.unlink(missing_ok=True)
            entry.path = None
        if entry.state is None:
            self._remove(entry)

    # -- disk format ------------------------------------------------------------------

    def _write_loop(self) -> None:
        while (job := self._writes.get()) is not None:
            entry, state = job
            try:
                self._write(entry, state)
            except OSError as exc:  # a full disk loses a cache entry, nothing else
                log.warning("could not write a prompt cache file: %s", exc)
            finally:
                with self._lock:
                    entry.pending = False
                    if entry.state is None and entry.path is None:
                        self._remove(entry)
                self._writes.task_done()

    def _write(self, entry: Entry, state: bytearray) -> None:
        with self._lock:
            if entry.key not in self._entries or entry.size > self.limits.disk_bytes:
                return
        header = json.dumps({"fingerprint": self.fingerprint, "build": self.build,
                             "n_tokens": len(entry.tokens), "state_size": len(state),
                             "salt": entry.salt,
                             "crc32": zlib.crc32(state)}).encode()
        path = self.folder / f"{entry.key}.hrkv"
        tmp = path.with_suffix(".tmp")
        with tmp.open("wb") as out:
            out.write(_HEAD.pack(MAGIC, FORMAT, len(header)))
            out.write(header)
            out.write(array.array("i", entry.tokens).tobytes())
            out.write(state)
        os.replace(tmp, path)
        with self._lock:
            if entry.key not in self._entries:  # superseded while it was written
                path.unlink(missing_ok=True)
                return
            entry.path, entry.written = path, time.time()
            self._evict_disk()

    def _read_header(self, handle) -> tuple[dict, tuple[int, ...]]:
        """Checks the file is ours and returns its header and tokens; the handle is
        left at the start of the state bytes."""
        magic, version, length = _HEAD.unpack(handle.read(_HEAD.size))
        if magic != MAGIC or version != FORMAT:
            raise ValueError("not a prompt cache file of this format")
        header = json.loads(handle.read(length))
        if header["fingerprint"] != self.fingerprint:
            raise ValueError("saved by another model")
        if header["build"] != self.build:
            raise ValueError("saved by another llama.cpp build")
        tokens = array.array("i")
        tokens.frombytes(handle.read(4 * header["n_tokens"]))
        if len(tokens) != header["n_tokens"]:
            raise ValueError("truncated")
        return header, tuple(tokens)

    def _scan(self) -> None:
        for tmp in self.folder.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        found = []
        for path in self.folder.glob("*.hrkv"):
            try:
                found.append((path.stat().st_mtime, path))
            except OSError:
                continue
        for written, path in sorted(found):
            try:
                with path.open("rb") as handle:
                    header, tokens = self._read_header(handle)
                    if path.stat().st_size != handle.tell() + header["state_size"]:
                        raise ValueError("truncated")
            except (OSError, ValueError, KeyError, struct.error) as exc:
                log.warning("removing prompt cache file %s: %s", path.name, exc)
                self.stats["rejected_files"] += 1
                path.unlink(missing_ok=True)
                continue
            self._add(Entry(path.stem, tokens, header["state_size"], path=path,
                            salt=header.get("salt", ""), written=written))
        self._evict_disk()

    def _read_verified(self, path: Path) -> bytearray | None:
        try:
            with path.open("rb") as handle:
                header, _tokens = self._read_header(handle)
                state = bytearray(header["state_size"])
                if handle.readinto(state) != len(state) or handle.read(1):
                    raise ValueError("wrong length")
            if zlib.crc32(state) != header["crc32"]:
                raise ValueError("checksum mismatch")
            return state
        except (OSError, ValueError, KeyError, struct.error) as exc:
            log.warning("rejecting prompt cache file %s: %s", path.name, exc)
            self.stats["rejected_files"] += 1
            return None

