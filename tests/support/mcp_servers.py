"""The real MCP servers the tests run, as the user would configure them: the PyPI ones
(mcp-server-time, mcp-server-git) from the virtual environment, npm's (server-everything,
server-filesystem) from build/mcp-servers (make setup), and the misbehaving one."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from fixtures.network import free_port

ROOT = Path(__file__).resolve().parents[2]
NPM = ROOT / "build" / "mcp-servers" / "node_modules" / "@modelcontextprotocol"
BIN = Path(sys.executable).parent


def time_server() -> dict:
    return {"command": str(BIN / "mcp-server-time"), "args": ["--local-timezone", "UTC"]}


def git_server(repo: Path) -> dict:
    return {"command": str(BIN / "mcp-server-git"), "args": ["--repository", str(repo)]}


def misbehaving() -> dict:
    return {"command": sys.executable, "args": ["-m", "support.mcp_misbehaving"],
            "cwd": str(ROOT / "tests")}


def _npm(name: str) -> Path:
    script = NPM / name / "dist" / "index.js"
    if not script.exists():
        pytest.skip(f"npm's @modelcontextprotocol/{name} is not installed (make setup "
                    "installs it where npm exists)")
    return script


def everything_stdio() -> dict:
    return {"command": "node", "args": [str(_npm("server-everything")), "stdio"]}


def filesystem(folder: Path) -> dict:
    return {"command": "node", "args": [str(_npm("server-filesystem")), str(folder)]}


@contextmanager
def everything_http():
    """server-everything over Streamable HTTP on a free loopback port: its /mcp URL."""
    script = _npm("server-everything")
    port = free_port()
    process = subprocess.Popen(["node", str(script), "streamableHttp"],
                               env=dict(os.environ, PORT=str(port)),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("server-everything did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(10)
