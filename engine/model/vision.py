"""The loaded model's eyes: its projector, loaded where the plan counted it, and the
embeddings of the images it has seen, kept so that each image is encoded once.

An image's embeddings depend on the image and the projector only, so they are kept by
the image's hash (and the chunk's place in it) under the projector's fingerprint: in
RAM, least recently used out first, and on disk beside the prompt cache, where a
restarted engine finds them. A follow-up question about a picture then costs its
decode into the KV memory (or nothing, when the prompt cache holds the turn), never a
second pass through the vision tower."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path

import numpy as np

from ..conversation.images import DECODED_SIDE
from ..catalog.facts import checked_projector
from ..catalog.models import LocalModel
from ..catalog.projectors import ProjectorFacts
from ..llama.runtime import LlamaModel
from ..llama.vision import ImagePiece, Projector
from ..presets import LoadOverride


def wanted_projector(model: LocalModel, hidden: int | None,
                     override: LoadOverride | None) -> tuple[ProjectorFacts | None, str | None]:
    """The projector to load with `model`, or None and why it has no vision."""
    if model.projector is None:
        return None, f"{model.id} has no vision projector (an mmproj file beside it)"
    if override is not None and override.vision is False:
        return None, f"vision is turned off for {model.id} (its preset)"
    facts, problem = checked_projector(model.projector, hidden)
    if facts is None:
        return None, f"its projector cannot be used: {problem}"
    return (None, f"its projector {model.projector.name} does not fit: {problem}") if problem \
        else (facts, None)


def load_projector(facts: ProjectorFacts, llama: LlamaModel, device: str, n_threads: int,
                   image_tokens: tuple[int, int] = (-1, -1)) -> Projector:
    # a picture is decoded at the size the projector resizes it to (idefics3's longest
    # side), or at most DECODED_SIDE where its tiling or dynamic size decides later
    return Projector(Path(facts.path), llama, n_threads, device, *image_tokens,
                     longest=facts.preproc_size or DECODED_SIDE)


KNOWN_DIGESTS = 65_536  # pictures whose hash the cache remembers having encoded


class ImageCache:
    """Image embeddings by key, in RAM up to `ram_bytes`, and on disk in `folder` up to
    `disk_bytes` (each least recently used out first)."""

    def __init__(self, folder: Path | None, ram_bytes: int = 512 << 20,
                 disk_bytes: int = 1 << 30):
        self.folder, self.ram_bytes, self.disk_bytes = folder, ram_bytes, disk_bytes
        self._ram: OrderedDict[str, np.ndarray] = OrderedDict()
        self._held = 0
        self._lock = threading.Lock()
        self.encoded = self.found = 0  # the figures: tower passes, and passes saved
        self._digests: OrderedDict[str, None] = OrderedDict()  # pictures seen, newest last

    def embeddings(self, projector: Projector, piece: ImagePiece) -> np.ndarray:
        """The piece's embeddings: kept ones, else encoded now (and kept)."""
        kept = self._get(piece.key)
        if kept is not None and kept.size == piece.n_tokens * projector.n_embd:
            self.found += 1
            return kept
        embeddings = projector.encode(piece)
        self.encoded += 1
        self._put(piece.key, embeddings)
        return embeddings

    def knows(self, digest: str) -> bool:
        """Whether the picture with this file hash was encoded here (kept in RAM or on
        disk): a request resending it costs no tower pass, so no cap counts it."""
        with self._lock:
            if digest in self._digests:
                return True
        path = self._file(f"{digest}:0")
        return path is not None and path.exists()

    def _get(self, key: str) -> np.ndarray | None:
        with self._lock:
            if key in self._ram:
                self._ram.move_to_end(key)
                return self._ram[key]
        path = self._file(key)
        if path is None or not path.exists():
            return None
        try:
            found = np.load(path, allow_pickle=False)
            os.utime(path)  # its recency, for the disk tier's trimming
        except (OSError, ValueError):
            return None  # a damaged file is encoded again (and rewritten)
        self._remember(key, found)
        return found

    def _put(self, key: str, embeddings: np.ndarray) -> None:
        self._remember(key, embeddings)
        path = self._file(key)
        if path is None:
            return
        try:  # a full disk costs the next restart an encode, nothing else
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            partial = path.with_suffix(f".{os.getpid()}.part")
            with partial.open("wb") as handle:
                np.save(handle, embeddings, allow_pickle=False)
            partial.replace(path)
            self._trim_disk()
        except OSError:
            pass

    def _trim_disk(self) -> None:
        """The disk tier within `disk_bytes`: the least recently used files go first."""
        files = []
        for path in self.folder.glob("*.npy"):
            try:
                stat = path.stat()
            except OSError:  # another engine trimmed it meanwhile
                continue
            files.append((stat.st_mtime_ns, stat.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.disk_bytes:
                break
            path.unlink(missing_ok=True)
            total -= size

    def _remember(self, key: str, embeddings: np.ndarray) -> None:
        with self._lock:
            self._digests[key.partition(":")[0]] = None
            self._digests.move_to_end(key.partition(":")[0])
            while len(self._digests) > KNOWN_DIGESTS:
                self._digests.popitem(last=False)
            if key in self._ram:
                return
            self._ram[key] = embeddings
            self._held += embeddings.nbytes
            while self._held > self.ram_bytes and len(self._ram) > 1:
                _, dropped = self._ram.popitem(last=False)
                self._held -= dropped.nbytes

    def _file(self, key: str) -> Path | None:
        if self.folder is None:
            return None
        digest, _, n = key.partition(":")
        if not (len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
                and n.isdigit()):
            return None  # only the engine's own keys name files
        return self.folder / f"{digest}-{n}.npy"
