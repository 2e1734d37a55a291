"""The user's MCP servers: `mcp.json` in the `mcpServers` notation Claude Desktop, Cursor
and LM Studio share (a command with its arguments and environment, or a URL with its
headers), read entry by entry so one bad entry is listed with its reason and the others
serve; an existing file of those apps imported into it; secrets kept in the system
keyring where there is one."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import InvalidRequest
from ..files import write_atomic

LABEL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
# environment variables and headers whose values are secrets: kept out of mcp.json
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH|COOKIE)",
                         re.IGNORECASE)
IN_KEYRING = "${keyring}"  # mcp.json's value for a secret the keyring holds
KEYRING_SERVICE = "homerack-mcp"
DEFAULT_TIMEOUT_S = 60.0
MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class ServerSpec:
    """One server as the user configured it (or a request named it: `url` only)."""
    label: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    cwd: str | None = None
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    timeout_s: float = DEFAULT_TIMEOUT_S
    disabled: bool = False
    from_request: bool = False  # named by a request: connected through engine.outbound
    allowed_hosts: frozenset[str] = frozenset()  # which it may reach though not public

    @property
    def kind(self) -> str:
        return "http" if self.url else "stdio"

    @property
    def identity(self) -> str:
        """What approvals are bound to: the program, its arguments, its environment and
        folder, or the URL. A server whose command, environment (a PATH, a config) or
        folder changes is another server and asks again."""
        what = json.dumps([self.url] if self.url else
                          [self.command, list(self.args), sorted(self.env), self.cwd])
        return hashlib.sha256(what.encode()).hexdigest()[:16]

    def describe(self) -> str:
        """The server in one line, for the approval card and the log."""
        return self.url or " ".join([self.command or "", *self.args]).strip()


@dataclass(frozen=True)
class ServerConfig:
    servers: dict[str, ServerSpec] = field(default_factory=dict)
    problems: dict[str, str] = field(default_factory=dict)  # label: why it cannot be used


def read_config(path: Path | None) -> ServerConfig:
    """The servers in `path` (none when it does not exist); a file that is not JSON is one
    problem, an entry that is wrong is that entry's problem."""
    if path is None or not path.exists():
        return ServerConfig()
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"larger than {MAX_FILE_BYTES >> 20} MiB")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        return ServerConfig(problems={path.name: f"cannot be read: {exc}"})
    servers, problems = {}, {}
    for label, entry in _entries(data).items():
        try:
            servers[label] = spec_of(label, entry)
        except InvalidRequest as exc:
            problems[str(label)[:64]] = exc.message
    return ServerConfig(servers, problems)


def _entries(data) -> dict:
    """mcpServers (Claude Desktop, Cursor, LM Studio) or servers (VS Code)."""
    if not isinstance(data, dict):
        return {}
    entries = data.get("mcpServers", data.get("servers", {}))
    return entries if isinstance(entries, dict) else {}


def spec_of(label: str, entry, where: str = "") -> ServerSpec:
    """One mcpServers entry, checked; `where` names it in errors (a request's field)."""
    where = where or f"mcpServers.{label}"
    if not isinstance(label, str) or not LABEL.match(label):
        raise InvalidRequest(f"{where}: a server's name is 1-64 letters, digits, _ or -",
                             param=where)
    if not isinstance(entry, dict):
        raise InvalidRequest(f"{where} must be an object", param=where)
    url = entry.get("url") or entry.get("serverUrl")
    command = entry.get("command")
    if entry.get("type") == "sse" or (url and str(url).rstrip("/").endswith("/sse")):
        raise InvalidRequest(f"{where}: the SSE transport is deprecated; this server speaks "
                             "Streamable HTTP (its /mcp address) or stdio", param=where)
    if bool(url) == bool(command):
        raise InvalidRequest(f"{where} needs a command (stdio) or a url (Streamable HTTP)",
                             param=where)
    if url and not re.match(r"^https?://", str(url)):
        raise InvalidRequest(f"{where}.url must be an http(s) address", param=f"{where}.url")
    return ServerSpec(
        label, command=_text(command, f"{where}.command"),
        args=tuple(_text(a, f"{where}.args") for a in _list(entry.get("args"), f"{where}.args")),
        env=_pairs(entry.get("env"), f"{where}.env"), cwd=_text(entry.get("cwd"), f"{where}.cwd"),
        url=_text(url, f"{where}.url"), headers=_pairs(entry.get("headers"), f"{where}.headers"),
        timeout_s=_timeout(entry.get("timeout"), f"{where}.timeout"),
        disabled=bool(entry.get("disabled", False)))


def _text(value, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidRequest(f"{where} must be text", param=where)
    return value


def _list(value, where: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise InvalidRequest(f"{where} must be a list", param=where)
    return value


def _pairs(value, where: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidRequest(f"{where} must map names to text", param=where)
    return tuple(sorted(value.items()))


def _timeout(value, where: str) -> float:
    """Seconds (LM Studio and Cursor write milliseconds above 1000)."""
    if value is None:
        return DEFAULT_TIMEOUT_S
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise InvalidRequest(f"{where} must be a positive number of seconds", param=where)
    return float(value) / 1000 if value > 1000 else float(value)


# -- import and secrets --------------------------------------------------------------


def import_servers(source: Path, target: Path, keyring_backend=None) -> list[str]:
    """Add the servers of another app's file (Claude Desktop's, Cursor's, LM Studio's) to
    `target`; those already there by name are kept as they are. Secrets move to the
    keyring where there is one. Returns the names added."""
    try:
        incoming = _entries(json.loads(source.read_text(encoding="utf-8")))
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"{source} cannot be read as JSON: {exc}") from exc
    if not incoming:
        raise InvalidRequest(f"{source} has no mcpServers")
    data = _load(target)
    added = []
    for label, entry in incoming.items():
        if label in data["mcpServers"]:
            continue
        spec_of(label, entry)  # refused whole if any entry is wrong: nothing half-imported
        data["mcpServers"][label] = keep_secrets(label, dict(entry), keyring_backend)
        added.append(label)
    write_atomic(target, json.dumps(data, indent=2) + "\n")
    return added


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {"mcpServers": {}}
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"{path} is not valid JSON ({exc}): fix or remove it first") \
            from exc
    data.setdefault("mcpServers", {})
    return data


def keep_secrets(label: str, entry: dict, backend=None) -> dict:
    """The entry with each secret-looking env value and header put in the keyring and
    replaced by IN_KEYRING; unchanged when there is no keyring (the file is 0600)."""
    backend = backend or usable_keyring()
    if backend is None:
        return entry
    for part in ("env", "headers"):
        values = dict(entry.get(part) or {})
        for name, value in values.items():
            if SECRET_NAME.search(name) and value != IN_KEYRING:
                backend.set_password(KEYRING_SERVICE, f"{label}/{part}/{name}", value)
                values[name] = IN_KEYRING
        if values:
            entry[part] = values
    return entry


def with_secrets(spec: ServerSpec, backend=None) -> ServerSpec:
    """The spec with IN_KEYRING values read from the keyring (when starting it)."""
    from dataclasses import replace

    def filled(part: str, pairs) -> tuple:
        out = []
        for name, value in pairs:
            if value == IN_KEYRING:
                keys = backend or usable_keyring()
                value = keys.get_password(KEYRING_SERVICE, f"{spec.label}/{part}/{name}") \
                    if keys else None
                if value is None:
                    raise InvalidRequest(f"{spec.label}: the secret {name} is not in the "
                                         "keyring any more: set it again in mcp.json")
            out.append((name, value))
        return tuple(out)

    return replace(spec, env=filled("env", spec.env), headers=filled("headers", spec.headers))


def usable_keyring():
    """The system keyring, or None where there is none (a headless machine: keyring's
    fail backend)."""
    try:
        import keyring
        backend = keyring.get_keyring()
    except Exception:  # noqa: BLE001 - a broken keyring install is no keyring
        return None
    return None if getattr(backend, "priority", 0) <= 0 else backend


def other_apps_files(home: Path) -> dict[str, Path]:
    """Where the apps people move from keep their MCP servers, those that exist."""
    places = {
        "Claude Desktop": [home / ".config/Claude/claude_desktop_config.json",
                           home / "Library/Application Support/Claude/claude_desktop_config.json",
                           home / "AppData/Roaming/Claude/claude_desktop_config.json"],
        "Cursor": [home / ".cursor/mcp.json"],
        "LM Studio": [home / ".lmstudio/mcp.json", home / ".cache/lm-studio/mcp.json"],
    }
    return {app: path for app, paths in places.items() for path in paths if path.exists()}
