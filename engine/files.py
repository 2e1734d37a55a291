"""The small files the engine keeps (caches, journals, calibration, presets, downloads):
written whole through a temporary file of a name of its own, so a reader never sees half
a file and two processes writing one file never share a temporary; private (0600).

Bookkeeping (what speeds a later start, what a crash leaves for the next one) is written
best effort: a full disk costs that knowledge, never a load or an answer."""

from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger("homerack")


def write_atomic(path: Path, text: str) -> None:
    """`path` holds `text`, or (an OSError: a full disk) is as it was."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_best_effort(path: Path, text: str) -> bool:
    """write_atomic, and a warning in the log instead of an error: for bookkeeping."""
    try:
        write_atomic(path, text)
        return True
    except OSError as exc:
        log.warning("could not write %s (%s): going on without it", path, exc.strerror or exc)
        return False
