"""Paired devices and pairing.

A device proves itself with a key of 256 random bits that pairing gives it once; the
file keeps only its SHA-256 (a key that random needs no slow hash) and compares in
constant time. A pairing code is 6 digits, valid for CODE_TTL_S, used once; every wrong
code counts against the codes waiting: the WRONG_CODES_LOCK-th withdraws them all (a
chance of 2 in 100,000 for a guesser, per code shown) and tells the owner, who makes a
new one. Nothing locks: a LAN client guessing away cannot keep the household from pairing
(it once locked pairing for the whole engine, again and again, without a word).

(The cluster's pairing, engine/cluster/pairing.py, closes its window at the 3rd wrong
code: a worker is paired once by the person at both machines; a phone's code is read out
in a room where others may be trying theirs.)
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import secrets
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..errors import Forbidden, InvalidRequest, NotFound
from ..files import write_atomic

CODE_TTL_S = 300
WRONG_CODES_LOCK = 20  # wrong codes that withdraw the codes waiting
NAME = re.compile(r"^[\w .'-]{1,40}$")  # a person's words for a phone, shown everywhere


@dataclass(frozen=True)
class Device:
    name: str
    key_hash: str
    paired_at: float
    last_seen: float = 0.0
    parallel: int | None = None           # this device's limits; None: the owner's defaults
    tokens_per_minute: int | None = None

    def public(self) -> dict:
        out = asdict(self)
        del out["key_hash"]
        return out


@dataclass(frozen=True)
class Code:
    name: str
    code: str
    expires: float

    def public(self) -> dict:
        return {"name": self.name, "code": self.code,
                "expires_s": max(0, round(self.expires - time.time()))}


def checked_name(name) -> str:
    if not isinstance(name, str) or not NAME.match(name.strip()):
        raise InvalidRequest("name: 1 to 40 letters, digits, spaces, . ' - or _", param="name")
    return name.strip()


def _hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class Devices:
    """The paired devices of this engine (a private JSON file), and the codes waiting to
    pair one. Thread-safe: routes on the event loop and the engine read it."""

    def __init__(self, path: Path | None):
        self._path = path
        self._lock = threading.Lock()
        self._devices: dict[str, Device] = self._read()
        self._codes: dict[str, Code] = {}
        self._wrong = 0  # wrong codes against the codes waiting now
        self.withdrawn: dict | None = None  # when wrong codes last withdrew them, for the owner
        self._seen_saved = 0.0

    def _read(self) -> dict[str, Device]:
        if self._path is None or not self._path.is_file():
            return {}
        try:
            rows = json.loads(self._path.read_text(encoding="utf-8"))["devices"]
            return {row["name"]: Device(**row) for row in rows}
        except (OSError, ValueError, KeyError, TypeError):
            return {}  # a damaged file pairs nobody: safe, and the owner pairs again

    def _save(self) -> None:
        if self._path is not None:
            write_atomic(self._path, json.dumps(
                {"devices": [asdict(d) for d in self._devices.values()]}, indent=1))

    # -- the owner ------------------------------------------------------------

    def add(self, name) -> Code:
        """A code that pairs a device called `name` (a new code replaces an older one)."""
        name = checked_name(name)
        with self._lock:
            if name in self._devices:
                raise InvalidRequest(f"a device called {name!r} is paired already; remove "
                                     "it first or choose another name", param="name")
            self._codes = {c: v for c, v in self._codes.items()
                           if v.name != name and v.expires > time.time()}
            code = f"{secrets.randbelow(10**6):06d}"
            while code in self._codes:
                code = f"{secrets.randbelow(10**6):06d}"
            self._codes[code] = Code(name, code, time.time() + CODE_TTL_S)
            self.withdrawn = None  # a new code: the owner has seen it
            return self._codes[code]

    def remove(self, name: str) -> Device:
        with self._lock:
            device = self._devices.pop(name, None)
            if device is None:
                raise NotFound(f"no paired device is called {name!r}", param="name")
            self._save()
            return device

    def set_limits(self, name: str, parallel: int | None, tokens_per_minute: int | None):
        with self._lock:
            if name not in self._devices:
                raise NotFound(f"no paired device is called {name!r}", param="name")
            self._devices[name] = replace(self._devices[name], parallel=parallel,
                                          tokens_per_minute=tokens_per_minute)
            self._save()

    def get(self, name: str) -> Device | None:
        with self._lock:
            return self._devices.get(name)

    def listed(self) -> list[Device]:
        with self._lock:
            return sorted(self._devices.values(), key=lambda d: d.paired_at)

    def codes(self) -> list[Code]:
        with self._lock:
            return [c for c in self._codes.values() if c.expires > time.time()]

    # -- a device -------------------------------------------------------------

    def pair(self, code) -> tuple[Device, str]:
        """The device a valid code names, paired now, and its key (given once)."""
        now = time.time()
        with self._lock:
            waiting = self._codes.get(code) if isinstance(code, str) else None
            if waiting is None or waiting.expires <= now:
                self._wrong_code(now)
                raise Forbidden("that code is wrong or has expired; ask for a new one on "
                                "the desktop (Devices → Add a device)", param="code")
            del self._codes[code]
            key = secrets.token_urlsafe(32)
            device = Device(waiting.name, _hash(key), now, now)
            self._devices[device.name] = device
            self._save()
            return device, key

    def _wrong_code(self, now: float) -> None:
        """A wrong code counts against the codes waiting (none waiting: nothing to guess);
        the WRONG_CODES_LOCK-th withdraws them, and the owner is told."""
        if not any(c.expires > now for c in self._codes.values()):
            return
        self._wrong += 1
        if self._wrong >= WRONG_CODES_LOCK:
            self.withdrawn = {"at": now, "codes": sorted(c.name for c in self._codes.values()),
                              "why": f"{self._wrong} wrong pairing codes were tried: the "
                                     "codes waiting were withdrawn; make a new one"}
            self._codes, self._wrong = {}, 0

    def device_for(self, key: str) -> Device | None:
        """The device holding `key`, seen now; None for any other key."""
        if not key:
            return None
        digest = _hash(key)
        with self._lock:
            found = next((d for d in self._devices.values()
                          if hmac.compare_digest(d.key_hash, digest)), None)
            if found is None:
                return None
            now = time.time()
            self._devices[found.name] = found = replace(found, last_seen=now)
            if now - self._seen_saved > 60:  # last seen to the minute, not a write a request
                self._seen_saved = now
                self._save()
            return found
