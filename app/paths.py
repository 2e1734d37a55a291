"""Where Homerack keeps things, per platform (platformdirs). HOMERACK_HOME puts all of
it under one folder instead: tests and portable installs use it."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from engine.spawn import frozen


@dataclass(frozen=True)
class Paths:
    data: Path
    cache: Path
    runtime: Path

    @property
    def models(self) -> Path:
        return self.data / "models"

    @property
    def engine_file(self) -> Path:
        """Address, token and pid of this user's running engine (mode 0600)."""
        return self.runtime / "engine.json"

    @property
    def pairings(self) -> Path:
        """The workers this host may use (cluster/pairing.py; mode 0600)."""
        return self.data / "cluster" / "pairings.json"

    @property
    def worker_folder(self) -> Path:
        """This machine's identity and granted hosts when it shares itself."""
        return self.data / "worker"

    @property
    def gguf_cache(self) -> Path:
        return self.cache / "gguf-info.json"


def paths() -> Paths:
    home = os.environ.get("HOMERACK_HOME")
    if home:
        root = Path(home)
        return Paths(root / "data", root / "cache", root / "run")
    return Paths(
        Path(platformdirs.user_data_dir("homerack")),
        Path(platformdirs.user_cache_dir("homerack")),
        Path(platformdirs.user_runtime_dir("homerack")),
    )


def bundled_models() -> Path | None:
    """The packaged app's starter models, beside its libraries (None outside the app)."""
    return Path(sys._MEIPASS) / "models" if frozen() else None
