"""Where Homerack keeps things, per platform (platformdirs). HOMERACK_HOME puts all of
it under one folder instead: tests and portable installs use it.

Everything there is private to the user: conversations, cached answers, prompt-cache KV
files (they hold prompt tokens), logs, tokens. `make_private` makes the three folders
0700 and every process of Homerack creates its files with umask 077 (files 0600,
folders 0700), so no file needs to remember it."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from engine.spawn import frozen

TOOL_APPROVALS = "tool-approvals.json"  # in the data folder (Paths.tool_approvals)

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
    def mcp_config(self) -> Path:
        """The user's MCP servers, in the mcpServers notation of Claude Desktop and Cursor."""
        return self.data / "mcp.json"

    @property
    def tool_approvals(self) -> Path:
        """The user's lasting allow, ask or deny per tool: the app writes an allow, the
        engine reads (engine/tools/approvals.py)."""
        return self.data / TOOL_APPROVALS

    @property
    def tool_logs(self) -> Path:
        """MCP servers' stderr (LABEL.log) and the log of every call (calls.jsonl)."""
        return self.data / "logs" / "mcp"

    @property
    def gguf_cache(self) -> Path:
        return self.cache / "gguf-info.json"

    @property
    def gpu_runtime(self) -> Path:
        """NVIDIA's CUDA runtime for the packaged app's CUDA module, once fetched
        (engine/llama/cuda_runtime.py)."""
        return self.cache / "gpu-runtime"


def paths() -> Paths:
    home = os.environ.get("HOMERACK_HOME")
    if home:
        root = Path(home)
        return Paths(root / "data", root / "cache", root / "run")
    cache = Path(platformdirs.user_cache_dir("homerack"))
    return Paths(Path(platformdirs.user_data_dir("homerack")), cache, _runtime_dir(cache))


def _runtime_dir(cache: Path) -> Path:
    """The desktop's runtime folder; where the session has none (no XDG_RUNTIME_DIR: ssh,
    containers, cron), a private folder in the cache instead of platformdirs' shared
    temporary one and the warning it prints on every command."""
    if sys.platform.startswith(("win", "darwin")) or os.environ.get("XDG_RUNTIME_DIR"):
        return Path(platformdirs.user_runtime_dir("homerack"))
    return cache / "run"


def make_private(where: Paths) -> None:
    """Files this process (and its children) create are the user's alone; the folders
    that hold them too, including ones an earlier version made readable."""
    os.umask(0o077)
    for folder in (where.data, where.cache, where.runtime):
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)


def bundled_models() -> Path | None:
    """The packaged app's starter models, beside its libraries (None outside the app)."""
    return Path(sys._MEIPASS) / "models" if frozen() else None
