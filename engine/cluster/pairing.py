"""What pairing leaves behind, kept in files only their user can read (0600).

On the host: `Pairings`, the workers it may use — name, address, the pinned certificate
fingerprint and the token the worker issued. On the worker: `Grants`, the hosts it admits
(the SHA-256 of each token, never the token), and the pairing code with its attempt
limit. Revoking on either side ends the pairing."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

CODE_DIGITS = 6
ATTEMPTS_PER_MINUTE = 5     # wrong codes allowed a minute, from anyone (a code has 10^6 values)


def _write_private(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=1)
    os.replace(tmp, path)


def _read(path: Path) -> list:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return data if isinstance(data, list) else []


@dataclass(frozen=True)
class Pairing:
    name: str
    address: str        # host:port of the worker's gateway
    fingerprint: str    # SHA-256 of its certificate, pinned
    token: str


class Pairings:
    """The host's paired workers."""

    def __init__(self, path: Path):
        self.path = path

    def all(self) -> list[Pairing]:
        return [Pairing(**entry) for entry in _read(self.path)
                if isinstance(entry, dict) and set(entry) == set(Pairing.__dataclass_fields__)]

    def add(self, pairing: Pairing) -> None:
        kept = [p for p in self.all() if p.address != pairing.address and p.name != pairing.name]
        _write_private(self.path, [asdict(p) for p in kept + [pairing]])

    def revoke(self, key: str) -> bool:
        """Forget the worker with this name or address."""
        kept = [p for p in self.all() if key not in (p.name, p.address)]
        changed = len(kept) != len(self.all())
        _write_private(self.path, [asdict(p) for p in kept])
        return changed

    def find(self, key: str) -> Pairing | None:
        return next((p for p in self.all() if key in (p.name, p.address)), None)


class Grants:
    """The worker's admitted hosts and its pairing code."""

    def __init__(self, path: Path, code: str | None = None):
        self.path = path
        self.fixed = code is not None       # a code given by the user stays (scripts)
        self.code = code or new_code()
        self._failures: list[float] = []
        self._lock = threading.Lock()

    def hosts(self) -> list[dict]:
        return [e for e in _read(self.path) if isinstance(e, dict) and "token_sha256" in e]

    def admits(self, token: object) -> str | None:
        """The name of the host this token was issued to; None when it is no grant."""
        if not isinstance(token, str):
            return None
        digest = hashlib.sha256(token.encode()).hexdigest()
        return next((e["host"] for e in self.hosts()
                     if hmac.compare_digest(e["token_sha256"], digest)), None)

    def try_code(self, proof: object, expected: callable) -> tuple[str | None, str]:
        """(token, "") when `proof` matches expected(code); (None, why) otherwise."""
        with self._lock:
            now = time.monotonic()
            self._failures = [t for t in self._failures if now - t < 60]
            if len(self._failures) >= ATTEMPTS_PER_MINUTE:
                wait = 60 - (now - self._failures[0])
                return None, f"too many wrong pairing codes; try again in {wait:.0f} s"
            if not isinstance(proof, str) or not hmac.compare_digest(proof, expected(self.code)):
                self._failures.append(now)
                return None, "wrong pairing code"
            if not self.fixed:
                self.code = new_code()  # one-time: the next host gets a new one
            return secrets.token_urlsafe(32), ""

    def grant(self, token: str, host: str) -> None:
        entry = {"host": host, "token_sha256": hashlib.sha256(token.encode()).hexdigest(),
                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        kept = [e for e in self.hosts() if e["host"] != host]  # a host pairing again
        _write_private(self.path, kept + [entry])

    def revoke(self, host: str) -> bool:
        kept = [e for e in self.hosts() if e["host"] != host]
        changed = len(kept) != len(self.hosts())
        _write_private(self.path, kept)
        return changed


def new_code() -> str:
    return f"{secrets.randbelow(10 ** CODE_DIGITS):0{CODE_DIGITS}d}"
