"""What a host and a worker's gateway say before the RPC bytes flow: one JSON line each
way over TLS. The host's line names the mode (pair, control, rpc), its versions and its
credential; the worker's answers ok or why not. Nothing reaches llama.cpp's RPC server
before the worker has answered ok to an `rpc` line."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import re
from functools import cache
from importlib import metadata

SERVICE = "_homerack._tcp.local."
DEFAULT_PORT = 50151
LINE_LIMIT = 64 * 1024      # a hello is small; anything longer is not one of ours
HELLO_TIMEOUT_S = 5.0
HEARTBEAT_S = 0.3           # the host pings each worker this often
LOST_AFTER_S = 1.8          # no answer for this long: the worker is gone (the target: 2 s)


class Refused(Exception):
    """The other side said no (or is not a Homerack gateway); the message says why."""


@cache
def homerack_version() -> str:
    try:
        return metadata.version("homerack")
    except metadata.PackageNotFoundError:
        return "0.0.0"


@cache
def rpc_protocol() -> str:
    """llama.cpp's RPC protocol version, from the ggml-rpc.h the wheel ships (found without
    loading llama.cpp: the app pairs from its UI process)."""
    from importlib.util import find_spec
    from pathlib import Path

    spec = find_spec("llama_cpp")
    if spec is None or spec.origin is None:
        return "unknown"
    header = Path(spec.origin).parents[1] / "include" / "ggml-rpc.h"
    try:
        text = header.read_text()
    except OSError:
        return "unknown"
    parts = [re.search(rf"RPC_PROTO_{p}_VERSION\s+(\d+)", text) for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(m.group(1) for m in parts) if all(parts) else "unknown"


def versions() -> dict:
    import os

    # HOMERACK_RPC_PROTOCOL stands in for another llama.cpp build (the mismatch tests).
    return {"homerack": homerack_version(),
            "rpc": os.environ.get("HOMERACK_RPC_PROTOCOL") or rpc_protocol()}


def mismatch(ours: dict, theirs: dict) -> str | None:
    """Why two sides cannot work together, in words; None when they can. llama.cpp's RPC
    protocol must match exactly (its ops are numbered); Homerack by major.minor."""
    if theirs.get("rpc") != ours["rpc"]:
        return (f"llama.cpp RPC protocol {theirs.get('rpc')} there, {ours['rpc']} here: "
                "update Homerack on both machines to the same version")
    if str(theirs.get("homerack", "")).split(".")[:2] != ours["homerack"].split(".")[:2]:
        return (f"Homerack {theirs.get('homerack')} there, {ours['homerack']} here: "
                "update both machines to the same version")
    return None


def code_proof(code: str, worker_fingerprint: str) -> str:
    """Proof of the pairing code bound to the certificate the host sees: a relay that
    shows the host its own certificate cannot pass it on to the real worker."""
    return hmac.new(code.strip().encode(), worker_fingerprint.encode(), hashlib.sha256).hexdigest()


async def read_line(reader: asyncio.StreamReader) -> dict:
    try:
        line = await asyncio.wait_for(reader.readuntil(b"\n"), HELLO_TIMEOUT_S)
        message = json.loads(line)
    except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
            ValueError, ConnectionError) as exc:
        raise Refused(f"no Homerack answer ({type(exc).__name__})") from None
    if not isinstance(message, dict):
        raise Refused("not a Homerack message")
    return message


async def write_line(writer: asyncio.StreamWriter, message: dict) -> None:
    writer.write(json.dumps(message).encode() + b"\n")
    await writer.drain()
