"""A real MCP server (the official SDK's FastMCP, over stdio) whose tools misbehave on
purpose: one kills the server, one never answers, one answers 10 MB, one fails. Run as
`python -m support.mcp_misbehaving` (tests/support on the path)."""

from __future__ import annotations

import os
import sys
import time

from mcp.server.fastmcp import FastMCP

server = FastMCP("misbehaving")


@server.tool()
def crash() -> str:
    """Exit the server's process at once."""
    print("crashing on purpose", file=sys.stderr, flush=True)
    os._exit(3)


@server.tool()
def hang() -> str:
    """Never answer."""
    time.sleep(3600)
    return "late"


@server.tool()
def huge(megabytes: int = 10) -> str:
    """Answer with this many megabytes of text."""
    return "x" * (megabytes << 20)


@server.tool()
def fail() -> str:
    """Raise an error (the SDK returns it as an error result)."""
    raise RuntimeError("this tool always fails")


@server.tool()
def environment() -> str:
    """The names of the environment variables this server was started with."""
    return " ".join(sorted(os.environ))


if __name__ == "__main__":
    server.run("stdio")
