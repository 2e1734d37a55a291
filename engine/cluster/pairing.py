"""What pairing leaves behind, kept in files only their user can read (0600).

On the host: `Pairings`, the workers it may use — name, address, the pinned certificate
fingerprint and the token the worker issued. On the worker: `Grants`, the hosts it admits
(the SHA-256 of each token, never the token), and `PairingWindow`, when it accepts a new
host: only for WINDOW_S after its owner asks (`homerack worker` at start, `homerack
worker --pair` later, through the private file `window.json`), with one code, closed by
one success or WRONG_CODES wrong ones. Revoking on either side ends the pairing.

(The home's devices, engine/home/devices.py, withdraw their codes at the 20th wrong one:
a worker is paired once by the person standing at both machines, so a third wrong code is
someone else; phones are paired in a room where several people type codes at once.)"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import HomerackError
from ..files import read_json, write_atomic
from .protocol import Refused

CODE_DIGITS = 6
WINDOW_S = 300              # pairing stays open this long after the owner opens it
WRONG_CODES = 3             # then it closes: a guesser has 3 in 10^6, and a new code is shown


_TEXTS = {"type": "string"}
_PAIRED = ("name", "address", "fingerprint", "token")
_PAIRINGS = {"type": "array", "items": {"type": "object", "required": list(_PAIRED),
                                        "properties": {key: _TEXTS for key in _PAIRED}}}
_GRANTS = {"type": "array", "items": {"type": "object", "required": ["host", "token_sha256"],
                                      "properties": {"host": _TEXTS, "token_sha256": _TEXTS}}}
_WINDOW = {"type": "object", "properties": {"code": {"type": ["string", "null"]},
                                            "expires": {"type": "number"}}}


def _write_private(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    write_atomic(path, json.dumps(data, indent=1))  # a file of its own: 0600


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
        return [Pairing(**{key: entry[key] for key in _PAIRED})
                for entry in read_json(self.path, _PAIRINGS) or ()]

    def add(self, pairing: Pairing, replace: bool = False) -> None:
        """Remember `pairing` (in place of one at the same address: a reinstalled worker).
        Another worker of the same name elsewhere is refused unless `replace`: two
        machines share a hostname more often than one moves."""
        same_name = self.find(pairing.name)
        if same_name and same_name.address != pairing.address and not replace:
            raise PairingConflict(
                f"a worker named {pairing.name} is already paired at {same_name.address}; "
                f"pair again with --replace to use the one at {pairing.address} instead, or "
                "give one of them another name (homerack worker --name NAME)")
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


class PairingConflict(HomerackError):
    status = 409
    kind = "pairing_conflict"


class Grants:
    """The worker's admitted hosts."""

    def __init__(self, path: Path):
        self.path = path

    def hosts(self) -> list[dict]:
        return read_json(self.path, _GRANTS) or []

    def admits(self, token: object) -> str | None:
        """The name of the host this token was issued to; None when it is no grant."""
        if not isinstance(token, str):
            return None
        digest = hashlib.sha256(token.encode()).hexdigest()
        return next((e["host"] for e in self.hosts()
                     if hmac.compare_digest(e["token_sha256"], digest)), None)

    def grant(self, host: str) -> str:
        """A new token for `host` (replacing its earlier one); only its digest is kept."""
        token = secrets.token_urlsafe(32)
        entry = {"host": host, "token_sha256": hashlib.sha256(token.encode()).hexdigest(),
                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        kept = [e for e in self.hosts() if e["host"] != host]  # a host pairing again
        _write_private(self.path, kept + [entry])
        return token

    def revoke(self, host: str) -> bool:
        kept = [e for e in self.hosts() if e["host"] != host]
        changed = len(kept) != len(self.hosts())
        _write_private(self.path, kept)
        return changed


class PairingWindow:
    """When the worker accepts pairing, and with which code. The owner opens it by
    writing `path` (0600, in the worker's private folder: `open_window`); the worker
    reads it again whenever the file changes (`refresh`)."""

    def __init__(self, path: Path):
        self.path = path
        self.code: str | None = None
        self.expires = 0.0  # wall-clock seconds (the file is written by another process)
        self.wrong = 0
        self._seen: float | None = None
        self._lock = threading.Lock()

    def refresh(self) -> None:
        try:
            changed = self.path.stat().st_mtime_ns
        except OSError:
            return
        if changed == self._seen:
            return
        self._seen = changed
        entry = read_json(self.path, _WINDOW) or {}
        with self._lock:
            self.code, self.expires, self.wrong = entry.get("code"), entry.get("expires", 0.0), 0

    def current(self) -> str:
        """The code while the window is open; Refused (saying how to open it) when not."""
        self.refresh()
        with self._lock:
            if self.code and time.time() < self.expires:
                return self.code
        raise Refused("pairing is closed on this worker: on it, run `homerack worker --pair` "
                      "(or turn Share off and on in the app) and use the code it shows")

    def failed(self) -> int:
        """Count a wrong code; the tries left (0: the window closed)."""
        with self._lock:
            self.wrong += 1
            if self.wrong >= WRONG_CODES:
                self.code = None
            return max(WRONG_CODES - self.wrong, 0)

    def close(self) -> None:
        with self._lock:
            self.code = None
        _write_private(self.path, {})


def window_file(folder: Path) -> Path:
    """Where the owner opens pairing for the worker that keeps `folder`."""
    return folder / "window.json"


def open_window(path: Path, code: str | None = None, seconds: float = WINDOW_S) -> tuple[str, float]:
    """Open pairing on the worker whose window file is `path`: (the code, its expiry)."""
    code = code or new_code()
    expires = time.time() + seconds
    _write_private(path, {"code": code, "expires": expires})
    return code, expires


def new_code() -> str:
    return f"{secrets.randbelow(10 ** CODE_DIGITS):0{CODE_DIGITS}d}"
