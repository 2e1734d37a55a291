"""A model file's identity, cheap enough to take at every load: what caches key on (the
prompt cache's disk tier, the response cache, cut drafts) so that an answer or a KV state
is never reused for a different file under the same name."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path


def model_fingerprint(path: Path) -> str:
    """Cheap identity of a model file: its size and first and last 4 MiB."""
    digest = hashlib.sha256()
    size = path.stat().st_size
    with path.open("rb") as handle:
        digest.update(handle.read(4 << 20))
        handle.seek(max(0, size - (4 << 20)))
        digest.update(handle.read(4 << 20))
    digest.update(str(size).encode())
    return digest.hexdigest()


class Fingerprints:
    """Model fingerprints, read again only when a file's size or mtime changes (reading
    8 MiB of a model per request would cost more than the whole cache hit)."""

    def __init__(self):
        self._known: dict[Path, tuple[tuple[int, int], str]] = {}
        self._lock = threading.Lock()

    def of(self, path: Path) -> str:
        stat = path.stat()
        stamp = (stat.st_size, stat.st_mtime_ns)
        with self._lock:
            known = self._known.get(path)
        if known and known[0] == stamp:
            return known[1]
        value = model_fingerprint(path)
        with self._lock:
            self._known[path] = (stamp, value)
        return value
