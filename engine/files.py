"""The small files the engine keeps (caches, journals, calibration, presets, downloads):
written whole through a temporary file of a name of its own, so a reader never sees half
a file and two processes writing one file never share a temporary; private (0600).

Bookkeeping (what speeds a later start, what a crash leaves for the next one) is written
best effort: a full disk costs that knowledge, never a load or an answer. Every such file
is read back through a schema of its shape: a wrong type falls back to the defaults with
a warning, never a crash later."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from dataclasses import fields
from pathlib import Path

log = logging.getLogger("homerack")


def write_atomic(path: Path, text: str) -> None:
    """`path` holds `text`, or (an OSError: a full disk) is as it was. The text reaches
    the disk before the name points at it, and the name before this returns: after a
    power cut the file is the old one or the new one, never empty."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _sync_folder(path.parent)


def _sync_folder(folder: Path) -> None:
    """The rename made durable (a folder's entry is data of its own on POSIX)."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # Windows cannot open a folder: its rename is durable enough
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems refuse a folder's fsync: the file itself is synced
        pass
    finally:
        os.close(fd)


def write_best_effort(path: Path, text: str) -> bool:
    """write_atomic, and a warning in the log instead of an error: for bookkeeping."""
    try:
        write_atomic(path, text)
        return True
    except OSError as exc:
        log.warning("could not write %s (%s): going on without it", path, exc.strerror or exc)
        return False


def read_json(path: Path | None, schema: dict):
    """The JSON in `path` when it has the shape `schema` (JSON Schema) describes; None
    when there is no such file, and, with a warning in the log, when it is not JSON or
    not of that shape (another version's file, a hand edit, a disk error): whoever reads
    it falls back to its defaults instead of failing on a wrong type later."""
    import jsonschema

    if path is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        jsonschema.validate(data, schema)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError, jsonschema.ValidationError) as exc:
        why = exc.message if isinstance(exc, jsonschema.ValidationError) else exc
        log.warning("%s is not what Homerack wrote (%s): using the defaults", path, why)
        return None
    return data


_JSON_TYPES = {"int": "integer", "float": "number", "bool": "boolean", "str": "string",
               "None": "null"}


def dataclass_schema(kind: type) -> dict:
    """The JSON Schema of a flat dataclass whose fields are int, float, bool, str or None
    (alone or joined with |): each known key of its type, other keys allowed (a later
    version's file)."""
    return {"type": "object", "properties": {
        f.name: {"type": [_JSON_TYPES[part.strip()] for part in str(f.type).split("|")]}
        for f in fields(kind)}}


NUMBERS = {"type": "object", "additionalProperties": {"type": "number"}}
STRINGS = {"type": "array", "items": {"type": "string"}}
