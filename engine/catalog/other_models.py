"""The models other apps keep, as the store lists them beside its own folder's: found
(other_apps.py) in the sources the user left on and the folders they added, each listed
once.

The same file found twice is one model: the first place keeps it (Homerack's folder,
then the sources in other_apps.SOURCES' order) and lists the others as `also_at`. Two
places hold the same file when they are one file (a link, the same inode), when the
names their apps give them carry the same sha256 (Ollama's blobs, the Hub cache's), or
when their sizes agree and their fingerprints (first and last 4 MiB) too. A model's id
is its name in Ollama ("qwen3:30b-a3b"), its folder's in Jan (which keeps
`<id>/model.gguf`), or its file's name without `.gguf` for the others, with `@source`
added when that id is taken already.

What was found is kept until something changes (watch.py rescans), so listing the models
for every request reads directories once, not every time.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from ..errors import InvalidRequest
from ..files import read_json, write_atomic
from .other_apps import FOLDER, LABELS, SOURCES, Found, SPLIT_PART, find, known_places
from .fingerprint import Fingerprints
from .local_model import LocalModel

# HOMERACK_MODEL_SOURCES: the sources read ("none", or names joined by commas), over the
# user's choices (a portable install, a test that must not see this machine's models)
SOURCES_ENV = "HOMERACK_MODEL_SOURCES"
_CHOICES_SCHEMA = {"type": "object", "properties": {
    "off": {"type": "array", "items": {"type": "string"}},
    "folders": {"type": "array", "items": {"type": "string"}}}}


@dataclass(frozen=True)
class SourceChoices:
    """What the user chose: the sources left off, the folders added."""
    off: frozenset[str] = frozenset()
    folders: tuple[Path, ...] = ()

    def as_dict(self) -> dict:
        return {"off": sorted(self.off), "folders": [str(f) for f in self.folders]}


@dataclass
class _Listed:
    model: object  # models.LocalModel
    digest: str | None
    also_at: list[tuple[str, str]] = field(default_factory=list)


class _Listing:
    """The models listed so far, by sha256, by inode and by size, so that a model found
    is compared with few others (measured: 900 merged in 1.4 s when each met every
    other, 0.1 s so). Two files are one when their sha256 agree (where both are named),
    when they are one inode, or when their sizes and fingerprints agree."""

    def __init__(self, fingerprints: Fingerprints):
        self.fingerprints = fingerprints
        self.all: list[_Listed] = []
        self._by_digest: dict[str, _Listed] = {}
        self._by_inode: dict[tuple[int, int], _Listed] = {}
        self._by_size: dict[int, list[_Listed]] = {}
        self._printed: dict[int, dict[str, _Listed]] = {}  # by size: fingerprint -> model
        self._counted: dict[int, int] = {}  # by size: how many are fingerprinted

    def add(self, entry: _Listed) -> None:
        self.all.append(entry)
        if entry.digest:
            self._by_digest.setdefault(entry.digest, entry)
        stat = _stat(entry.model.path)
        if stat is not None:
            self._by_inode.setdefault((stat.st_dev, stat.st_ino), entry)
            self._by_size.setdefault(stat.st_size, []).append(entry)

    def twin_of(self, item: Found) -> _Listed | None:
        if item.digest and item.digest in self._by_digest:
            return self._by_digest[item.digest]
        stat = _stat(item.path)
        if stat is None:
            return None
        if (stat.st_dev, stat.st_ino) in self._by_inode:
            return self._by_inode[(stat.st_dev, stat.st_ino)]
        if stat.st_size not in self._by_size:
            return None
        try:
            twin = self._prints(stat.st_size).get(self.fingerprints.of(item.path))
        except OSError:
            return None
        # two sha256 named and different (by_digest missed) are two files
        return None if twin is None or (twin.digest and item.digest) else twin

    def _prints(self, size: int) -> dict[str, _Listed]:
        """The fingerprints of the models of this size, each read once."""
        prints = self._printed.setdefault(size, {})
        for entry in self._by_size[size][self._counted.get(size, 0):]:
            try:
                prints.setdefault(self.fingerprints.of(entry.model.path), entry)
            except OSError:
                pass
        self._counted[size] = len(self._by_size[size])
        return prints


class OtherAppsModels:
    """The other apps' models and the user's choices of sources; `models(own)` merges
    them with the folder's own."""

    def __init__(self, places: Mapping[str, tuple[Path, ...]], choices_file: Path | None = None,
                 env: Mapping[str, str] = os.environ):
        self.places = dict(places)
        self.choices_file = choices_file
        self.choices = self._read_choices()
        self.forced = _forced(env.get(SOURCES_ENV))
        self.fingerprints = Fingerprints()
        self._lock = threading.Lock()
        self._found: list[Found] | None = None
        self._generation = 0  # of what was found
        self._looked = float("-inf")  # when it was last forgotten
        self._merged: tuple[tuple, list] | None = None

    @classmethod
    def of_this_machine(cls, choices_file: Path | None) -> "OtherAppsModels":
        import sys

        return cls(known_places(os.environ, sys.platform), choices_file)

    # -- what the user chose --------------------------------------------------------

    def enabled(self, source: str) -> bool:
        if self.forced is not None:
            return source in self.forced
        return source not in self.choices.off

    def roots(self) -> list[Path]:
        """Every folder read now (the watcher watches them)."""
        return [root for source, roots in self.places.items() if self.enabled(source)
                for root in roots] + list(self._folders())

    def choose(self, source: str | None = None, enabled: bool | None = None,
               folders: list[Path] | None = None) -> SourceChoices:
        """The user's choices read again (another process may have added a folder), a
        source turned on or off, the added folders set; kept, and looked at again."""
        if source is not None and source not in SOURCES:
            raise InvalidRequest(f"unknown source {source!r} (one of {', '.join(SOURCES)})",
                                 param="source")
        self.choices = self._read_choices()
        off = set(self.choices.off)
        if source is not None and enabled is not None:
            (off.discard if enabled else off.add)(source)
        chosen = SourceChoices(frozenset(off), tuple(folders) if folders is not None
                               else self.choices.folders)
        if chosen != self.choices and self.choices_file is not None:
            write_atomic(self.choices_file, json.dumps(chosen.as_dict(), indent=1))
        self.choices = chosen
        self.refresh()
        return chosen

    def describe(self) -> list[dict]:
        """Each source: its name in words, its folders (those that exist), on or off,
        how many models it holds and which cannot be used."""
        found = self.found()
        out = []
        for source, roots in [*self.places.items(), *((FOLDER, (f,)) for f in self._folders())]:
            mine = [f for f in found if f.source == source and
                    (source != FOLDER or _under(f.path, roots[0]))]
            out.append({"source": source, "label": LABELS[source],
                        "folders": [str(r) for r in roots], "present": [str(r) for r in roots
                                                                        if is_dir(r)],
                        "enabled": source == FOLDER or self.enabled(source),
                        "models": sum(1 for f in mine if not f.problem),
                        "problems": [{"name": f.name, "problem": f.problem}
                                     for f in mine if f.problem]})
        return out

    # -- what is found ---------------------------------------------------------------

    def found(self) -> list[Found]:
        with self._lock:
            if self._found is None:
                places = {s: r for s, r in self.places.items() if self.enabled(s)}
                self._found = find(places, self._folders())
            return self._found

    def refresh(self) -> None:
        """Forget what was found: the next listing looks again."""
        with self._lock:
            self._found, self._merged = None, None
            self._generation += 1
            self._looked = time.monotonic()

    def refresh_if_stale(self, age_s: float = 1.0) -> None:
        """refresh, unless that was done less than `age_s` ago (a request naming a model
        nobody has looks once, not on every retry)."""
        if time.monotonic() - self._looked >= age_s:
            self.refresh()

    def models(self, own: list) -> tuple[list, list]:
        """(usable, unusable): `own` and every model found elsewhere, each file once;
        those that cannot be used, with their problem."""
        found = self.found()
        key = (self._generation, tuple((m.path, m.size_bytes) for m in own))
        merged = self._merged
        if merged is not None and merged[0] == key:
            return merged[1]
        result = self._merge(own, found)
        self._merged = (key, result)
        return result

    def _merge(self, own: list, found: list[Found]) -> tuple[list, list]:
        listed, taken, unusable = _Listing(self.fingerprints), {m.id for m in own}, []
        for model in own:
            listed.add(_Listed(model, None))
        for item in found:
            model_id = _free_id(_id_for(item), item.source, taken)
            if item.problem:
                unusable.append(LocalModel(model_id, item.path, 0, False, source=item.source,
                                           label=item.name, problem=item.problem))
                taken.add(model_id)
                continue
            twin = listed.twin_of(item)
            if twin is not None:
                twin.also_at.append((item.source, item.name))
                continue
            taken.add(model_id)
            listed.add(_Listed(LocalModel(
                model_id, item.path, item.size_bytes, False, source=item.source,
                label=item.name, projector=item.projector, params=item.params,
                system=item.system, template=item.template, digest=item.digest),
                item.digest))
        usable = [replace(e.model, also_at=tuple(e.also_at)) if e.also_at else e.model
                  for e in listed.all]
        return usable, unusable

    def _folders(self) -> tuple[Path, ...]:
        return () if self.forced is not None and FOLDER not in self.forced \
            else self.choices.folders

    def _read_choices(self) -> SourceChoices:
        data = read_json(self.choices_file, _CHOICES_SCHEMA) or {}
        return SourceChoices(frozenset(data.get("off", ())) & set(SOURCES),
                             tuple(Path(f) for f in data.get("folders", ())))


def _forced(value: str | None) -> frozenset[str] | None:
    if value is None or not value.strip():
        return None
    names = {name.strip() for name in value.split(",")}
    return frozenset() if names == {"none"} else frozenset(names & {*SOURCES, FOLDER})


def _id_for(item: Found) -> str:
    if item.source == "ollama":
        return item.name
    if item.source == "jan" and len(Path(item.name).parts) > 1:
        return Path(item.name).parent.name  # Jan keeps <model id>/model.gguf
    name = Path(item.name).name
    split = SPLIT_PART.search(name)
    return name[:split.start()] if split else name[:-5] if name.lower().endswith(".gguf") \
        else name


def _free_id(wanted: str, source: str, taken: set[str]) -> str:
    if wanted not in taken:
        return wanted
    candidate, n = f"{wanted}@{source}", 2
    while candidate in taken:
        candidate, n = f"{wanted}@{source}-{n}", n + 1
    return candidate


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


def is_dir(path: Path) -> bool:
    """Whether `path` is a folder now; False where it cannot be asked (a dead mount)."""
    try:
        return path.is_dir()
    except OSError:
        return False


def _under(path: Path, root: Path) -> bool:
    try:
        path.relative_to(root)
        return True
    except ValueError:
        return False
