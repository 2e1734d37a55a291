"""A model file's identity, cheap enough to take at every load: what caches key on (the
prompt cache's disk tier, the response cache, cut drafts) so that an answer or a KV state
is never reused for a different file under the same name."""

from __future__ import annotations

import hashlib
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
