"""The desktop app's settings (sampling, the routing pair), each kept in a small JSON file;
and whether the engine it starts opens Ollama's API without the token (a flag file)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

from engine.files import dataclass_schema, read_json, write_atomic
from engine.tools.approvals import READ_ONLY_UNASKED  # noqa: F401 - a switch the engine reads


@dataclass(frozen=True)
class Sampling:
    temperature: float | None = None  # None: the model's default (the engine knows it)
    top_p: float | None = None
    max_tokens: int = 1024
    seed: int = -1  # -1: a new random seed each time
    speculation: str = "off"  # "off", "lookup", or "draft:<model id>" ("draft:auto" picks)
    # 2: temperature and top-p saved only when the user chose them. Version 1 saved the
    # old fixed 0.7 / 0.95 for everyone, which the small models answer nonsense with.
    version: int = 2

    def as_request(self) -> dict:
        request = {"max_tokens": self.max_tokens, "seed": None if self.seed < 0 else self.seed}
        request.update({name: value for name, value in
                        (("temperature", self.temperature), ("top_p", self.top_p))
                        if value is not None})
        if self.speculation.startswith("draft:"):
            request["draft_model"] = self.speculation.split(":", 1)[1]
        else:
            request["speculation"] = self.speculation
        return request


@dataclass(frozen=True)
class UiState:
    """How the window was left: its zoom step and appearance."""
    zoom: int = 0
    theme: str = "system"  # or "light", "dark"


@dataclass(frozen=True)
class RoutingChoice:
    """The models behind model "auto" (engine/routing.py); empty: routing off."""
    small: str = ""
    large: str = ""
    mode: str = "rules"  # or "cascade"

    @property
    def on(self) -> bool:
        return bool(self.small and self.large)


@dataclass(frozen=True)
class ToolChoice:
    """The MCP servers whose tools chats are offered, by label, comma-separated."""
    servers: str = ""

    @property
    def labels(self) -> tuple[str, ...]:
        return tuple(label for label in self.servers.split(",") if label)


def load_settings(path: Path, kind: type):
    """The settings of dataclass `kind` in `path`, the defaults where it is missing or
    not of that shape (wrong types too)."""
    data = read_json(path, dataclass_schema(kind))
    if data is None:
        return kind()
    known = {f.name for f in fields(kind)}
    return replace(kind(), **{k: v for k, v in data.items() if k in known})


def load_sampling(path: Path) -> Sampling:
    """The saved sampling; from a version 1 file (no "version") all but its fixed
    temperature and top-p, so the model's defaults apply."""
    saved = load_settings(path, Sampling)
    try:
        versioned = "version" in json.loads(path.read_text())
    except (OSError, ValueError, TypeError):
        versioned = False
    return saved if versioned else replace(saved, temperature=None, top_p=None)


def save_settings(path: Path, settings) -> None:
    write_atomic(path, json.dumps(asdict(settings)))


# The engine's switches the app starts it with, each a file in the data folder (present:
# on), kept by Settings: {file: the `serve` option it adds}.
OLLAMA_DOOR = "ollama-without-token"  # Ollama's API without the token on 127.0.0.1
IMAGE_URLS = "fetch-image-urls"       # requests' http(s) images fetched
REQUEST_MCP = "request-mcp-servers"   # requests may name MCP servers by URL
OLLAMA_PORT = 11434  # Ollama's own: the apps that cannot send a token look there
SWITCHES = {OLLAMA_DOOR: ("--ollama-port", str(OLLAMA_PORT)), IMAGE_URLS: ("--allow-image-urls",),
            REQUEST_MCP: ("--allow-request-mcp",)}


def switched_on(data: Path, name: str) -> bool:
    return (data / name).exists()


def switch(data: Path, name: str, on: bool) -> None:
    flag = data / name
    if on:
        flag.touch()
    else:
        flag.unlink(missing_ok=True)


def serve_switches(data: Path, args: list[str]) -> list[str]:
    """The options of the switches that are on, those `args` do not set already."""
    return [part for name, option in SWITCHES.items()
            if switched_on(data, name) and option[0] not in args for part in option]
