"""What a host and a worker's gateway say before the RPC bytes flow: one JSON line each
way over TLS. The host's line names the mode (pair, control, rpc), its versions and its
credential; the worker's answers ok or why not (pairing takes two more lines: the
exchange's confirmations, `Exchange`). Nothing reaches llama.cpp's RPC server
before the worker has answered ok to an `rpc` line."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import re
from functools import cache
from importlib import metadata

from spake2 import SPAKE2_A, SPAKE2_B
from spake2.spake2 import SPAKEError

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


class Exchange:
    """One side of pairing: SPAKE2 (a password-authenticated key exchange) on the code,
    bound to the certificate the host sees. Whoever answers at the worker's address learns
    nothing from it to guess the code offline: each connection tests one guess, online,
    and the worker counts them. A relay that shows the host its own certificate derives
    another key than the real worker, so the confirmations fail (the fingerprint is part
    of the exchange), and it cannot pass the exchange on."""

    def __init__(self, side: str, code: str, worker_fingerprint: str):
        kind = SPAKE2_A if side == "host" else SPAKE2_B
        self.side = side
        self._spake = kind(code.strip().encode(), idA=b"homerack host",
                           idB=f"homerack worker {worker_fingerprint}".encode())
        self.message = base64.b64encode(self._spake.start()).decode()
        self.key = b""

    def finish(self, theirs: object) -> None:
        try:
            self.key = self._spake.finish(base64.b64decode(str(theirs), validate=True))
        except (ValueError, TypeError, SPAKEError) as exc:
            raise Refused(f"not a pairing message ({type(exc).__name__})") from None

    def confirmation(self, side: str) -> str:
        """Proof that `side` derived the key (each side sends its own, checks the other)."""
        return hmac.new(self.key, f"confirm {side}".encode(), hashlib.sha256).hexdigest()

    def confirms(self, side: str, given: object) -> bool:
        return isinstance(given, str) and hmac.compare_digest(given, self.confirmation(side))

    def comparison(self) -> str:
        """Six digits both sides show, from the shared key (and so the certificate)."""
        digest = hmac.new(self.key, b"compare", hashlib.sha256).digest()
        number = int.from_bytes(digest[:4], "big") % 1_000_000
        return f"{number // 1000:03d} {number % 1000:03d}"


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
