"""What Homerack writes is the user's alone: conversations, cached answers, prompt-cache
KV files (they hold prompt tokens), the engine's address and token (folders 0700, files
0600); and a session without a runtime folder gets a private one, without a warning."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from support import ROOT
from support.engines import start_engine
from support.models import STARTER


def shared_with_others(root: Path) -> list[str]:
    """Files and folders under `root` (the test's HOMERACK_HOME) that a group or other
    users may read or enter (links are the starter models' and are not followed)."""
    found = []
    for path in root.rglob("*"):
        mode = path.lstat().st_mode
        if not stat.S_ISLNK(mode) and mode & 0o077:
            found.append(f"{path.relative_to(root)} {stat.filemode(mode)}")
    return found


@pytest.mark.slow
def test_the_engine_and_the_history_write_only_private_files(home):
    name = "private"
    process, address, _ = start_engine(home, name, ["--model", STARTER, "--ctx", "1024",
                                                    "--response-cache-mib", "16"])
    own = home / name
    try:
        with httpx.Client(base_url=address.url, timeout=120,
                          headers={"Authorization": f"Bearer {address.token}"}) as http:
            reply = http.post("/v1/chat/completions", json={
                "model": STARTER, "max_tokens": 4, "temperature": 0,
                "messages": [{"role": "user", "content": "A secret: my PIN is 4711."}]})
            assert reply.status_code == 200
            deadline = time.monotonic() + 60  # the idle engine saves the conversation's KV
            while not list((own / "cache" / "kv").rglob("*.*")) and time.monotonic() < deadline:
                time.sleep(0.2)
    finally:
        process.stop()
    subprocess.run([sys.executable, "-c", (
        "from app.paths import make_private, paths; make_private(paths()); "
        "from app.history import History; h = History(paths().data / 'history.sqlite3'); "
        "c = h.create(); h.add_message(c.id, 'user', 'my PIN is 4711'); h.close()")],
        cwd=ROOT, env=dict(os.environ, HOMERACK_HOME=str(own)), check=True)
    written = {p.name for p in own.rglob("*") if p.is_file()}
    assert {"history.sqlite3", "responses.sqlite"} <= written, written
    assert list((own / "cache" / "kv").rglob("*.*")), "no KV file was written"
    assert shared_with_others(own) == []


def test_a_session_without_a_runtime_folder_gets_a_private_one_and_no_warning(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_RUNTIME_DIR", "HOMERACK_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME")}
    env["HOME"] = str(tmp_path)
    result = subprocess.run([sys.executable, "-W", "default", "-c", (
        "from app.paths import make_private, paths; where = paths(); make_private(where); "
        "print(where.runtime)")], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    runtime = Path(result.stdout.strip())
    assert result.stderr == ""
    assert runtime == tmp_path / ".cache" / "homerack" / "run"
    assert stat.S_IMODE(runtime.stat().st_mode) == 0o700
