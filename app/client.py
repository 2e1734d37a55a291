"""A small client of the engine API for the CLI and the desktop app."""

from __future__ import annotations

import json
import time
from urllib.parse import quote
from dataclasses import dataclass, field
from typing import Callable, Iterator

import httpx

from .engine_proc import EngineAddress


class EngineError(Exception):
    """The engine answered with an error: its message is for people; `status` is the
    HTTP status, for code that must tell kinds apart (never shown)."""

    def __init__(self, message: str, status: int = 0):
        super().__init__(message)
        self.status = status


def adapter_text(name: str, scale: float) -> str:
    """An adapter and its scale in words: "persona", "persona ×0.5"."""
    return name + ("" if scale == 1 else f" ×{scale:g}")


@dataclass
class StreamedReply:
    """Filled in as a streamed reply arrives."""
    text: str = ""
    reasoning: str = ""  # the model's thinking, apart from the answer (reasoning models)
    thought_s: float | None = None  # from its first thought to its answer's first piece
    finish_reason: str | None = None
    usage: dict | None = None
    notes: list[str] = field(default_factory=list)
    n_ctx: int | None = None
    model: str | None = None  # the model that answered (with "auto": the one routed to)
    response_cache: str | None = None  # "hit": replayed from the response cache
    route: dict | None = None  # how "auto" chose the model
    adapters: list[dict] = field(default_factory=list)  # the LoRA adapters that answered
    tool_calls: list[dict] = field(default_factory=list)  # this round's: {id, name, arguments}
    citations: list[dict] | None = None  # with collections: the passages given (none found: [])
    remarks: list[str] = field(default_factory=list)  # said under the answer

    def detail(self) -> str:
        """How the answer came, in a few words, for the chat view."""
        parts = []
        if self.route:
            how = ("escalated" if self.route.get("escalated") else "kept") \
                if self.route.get("mode") == "cascade" else self.route.get("reason", "")
            parts.append(f"auto ({self.route.get('mode')}): {how}")
        if self.adapters:
            parts.append("adapter " + ", ".join(adapter_text(a["id"], a["scale"])
                                                for a in self.adapters))
        if self.response_cache == "hit":
            parts.append("from the response cache")
        if self.citations == []:
            parts.append("nothing in your documents matched: answered without them")
        # what the engine left out of the prompt for the context (engine/intake.py)
        parts += [note for note in self.notes if note.startswith("left out:")]
        return " · ".join(parts + self.remarks)


class EngineClient:
    def __init__(self, address: EngineAddress, timeout: float = 600.0):
        self.address = address
        self._http = httpx.Client(base_url=address.url, timeout=timeout,
                                  headers={"Authorization": f"Bearer {address.token}"})

    def models(self) -> list[dict]:
        return self._checked(self._http.get("/v1/models")).json()["data"]

    def health(self) -> dict:
        return self._checked(self._http.get("/health", timeout=5)).json()

    def hardware(self) -> dict:
        return self._checked(self._http.get("/v1/hardware", timeout=30)).json()

    def cluster(self) -> dict:
        """The machines, their stages and links (GET /v1/cluster)."""
        return self._checked(self._http.get("/v1/cluster", timeout=5)).json()

    def plan(self, model: str, n_ctx: int | None = None, gpu_layers: int | None = None,
             cpu_moe_layers: int | None = None, vision: bool | None = None) -> dict:
        """What loading `model` with these choices would use (nothing is loaded)."""
        body = _load_body(model, n_ctx, gpu_layers, cpu_moe_layers, vision)
        return self._checked(self._http.post("/v1/plan", json=body)).json()

    def load(self, model: str, n_ctx: int | None = None, gpu_layers: int | None = None,
             cpu_moe_layers: int | None = None, vision: bool | None = None) -> dict:
        """Load `model` with these choices; the engine's status once it is loaded."""
        body = _load_body(model, n_ctx, gpu_layers, cpu_moe_layers, vision)
        return self._checked(self._http.post("/v1/models/load", json=body)).json()

    def loaded(self) -> list[dict]:
        """The chat models the engine holds (GET /v1/models/loaded)."""
        return self._checked(self._http.get("/v1/models/loaded", timeout=5)).json()["data"]

    def unload(self, model: str) -> list[dict]:
        """Unload `model` now; what stays loaded."""
        reply = self._http.post("/v1/models/unload", json={"model": model}, timeout=60)
        return self._checked(reply).json()["loaded"]

    def keep(self, model: str, pinned: bool, ttl_s: float | None) -> dict:
        """How long `model` stays loaded, kept in its preset."""
        reply = self._http.put("/v1/models/preset",
                               json={"model": model, "pinned": pinned, "ttl_s": ttl_s})
        return self._checked(reply).json()

    def sources(self) -> list[dict]:
        """Where the engine finds models besides its folder (other apps', added folders)."""
        return self._checked(self._http.get("/v1/sources")).json()["data"]

    def choose_source(self, source: str | None = None, enabled: bool | None = None
                      ) -> list[dict]:
        """A source on or off; with neither, the engine reads the user's choices again
        (after the app added or removed a folder)."""
        body = {k: v for k, v in (("source", source), ("enabled", enabled)) if v is not None}
        return self._checked(self._http.put("/v1/sources", json=body)).json()["data"]

    # -- the Hub and downloads (run in the engine) ------------------------------------

    def hub_search(self, text: str, sort: str = "downloads") -> list[dict]:
        response = self._http.get("/v1/hub/search", params={"q": text, "sort": sort})
        return self._checked(response).json()["data"]

    def hub_quants(self, repo: str, n_ctx: int = 4096) -> dict:
        response = self._http.get(f"/v1/hub/repos/{repo}/quants", params={"ctx": n_ctx})
        return self._checked(response).json()

    def hub_card(self, repo: str) -> str:
        return self._checked(self._http.get(f"/v1/hub/repos/{repo}/card")).json()["text"]

    def hub_drafts(self, repo: str) -> list[dict]:
        return self._checked(self._http.get(f"/v1/hub/repos/{repo}/drafts")).json()["data"]

    def downloads(self) -> list[dict]:
        return self._checked(self._http.get("/v1/downloads", timeout=10)).json()["data"]

    def start_download(self, repo: str, quant: str) -> dict:
        body = {"repo": repo, "quant": quant}
        return self._checked(self._http.post("/v1/downloads", json=body)).json()

    def control_download(self, download_id: int, action: str) -> dict:
        """action: "pause", "resume" or "cancel"."""
        return self._checked(self._http.post(f"/v1/downloads/{download_id}/{action}")).json()

    def set_routing(self, small: str | None, large: str | None, mode: str = "rules") -> dict:
        """Turn routing on with a pair (its plan says whether both stay loaded), or off."""
        if not small or not large:
            return self._checked(self._http.delete("/v1/routing")).json()
        body = {"small": small, "large": large, "mode": mode}
        return self._checked(self._http.put("/v1/routing", json=body)).json()

    def stream_chat(self, messages: list[dict], reply: StreamedReply,
                    should_stop: Callable[[], bool] = lambda: False,
                    **options) -> Iterator[tuple[str, str]]:
        """Yield ("reasoning" | "content", text) pieces as they arrive; `reply` gets them
        too, with the finish reason and usage. When should_stop() turns true the stream is
        closed, which cancels the generation."""
        thinking_since = None
        body = {"messages": messages, "stream": True, "fit_pictures": True,
                "stream_options": {"include_usage": True},
                **{k: v for k, v in options.items() if v is not None}}
        with self._http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                self._checked(response)
            for line in response.iter_lines():
                if should_stop():
                    reply.finish_reason = "stopped"
                    return
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    raise EngineError(chunk["error"]["message"])
                extension = chunk.get("homerack", {})
                reply.notes.extend(extension.get("notes", []))
                reply.n_ctx = extension.get("n_ctx", reply.n_ctx)
                reply.model = chunk.get("model", reply.model)
                reply.response_cache = extension.get("response_cache", reply.response_cache)
                reply.route = extension.get("route", reply.route)
                reply.adapters = extension.get("adapters", reply.adapters)
                if "citations" in chunk:  # the first chunk: the passages the answer was given
                    reply.citations = chunk["citations"]
                if reply.adapters and reply.model:  # "BASE+ADAPTER": detail() names them
                    reply.model = reply.model.split("+")[0]
                if chunk.get("usage"):
                    reply.usage = chunk["usage"]
                for choice in chunk["choices"]:
                    reply.finish_reason = choice.get("finish_reason") or reply.finish_reason
                    _add_calls(reply.tool_calls, choice["delta"].get("tool_calls") or ())
                    thought = choice["delta"].get("reasoning_content")
                    if thought:
                        thinking_since = thinking_since or time.monotonic()
                        reply.reasoning += thought
                        yield "reasoning", thought
                    text = choice["delta"].get("content")
                    if text:
                        if thinking_since and reply.thought_s is None:
                            reply.thought_s = time.monotonic() - thinking_since
                        reply.text += text
                        yield "content", text
        if thinking_since and reply.thought_s is None:  # it thought to the end
            reply.thought_s = time.monotonic() - thinking_since

    @staticmethod
    def _checked(response: httpx.Response) -> httpx.Response:
        if response.status_code >= 400:
            try:
                message = response.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = response.text
            raise EngineError(message, response.status_code)
        return response

    # -- MCP tools (engine/api/admin/tool_routes.py) -------------------------------------------

    def mcp_servers(self) -> dict:
        return self._checked(self._http.get("/v1/mcp/servers")).json()

    def mcp_tools(self, label: str, model: str | None = None) -> dict:
        params = {"model": model} if model else {}
        return self._checked(self._http.get(f"/v1/mcp/servers/{label}/tools",
                                            params=params)).json()

    def call_tool(self, label: str, tool: str, arguments: dict, approved: str,
                  max_chars: int) -> dict:
        body = {"arguments": arguments, "approved": approved, "max_chars": max_chars}
        return self._checked(self._http.post(f"/v1/mcp/servers/{label}/tools/{tool}/call",
                                             json=body)).json()

    def decide_tool(self, label: str, tool: str, decision: str) -> dict:
        body = {"server": label, "tool": tool, "decision": decision}
        return self._checked(self._http.put("/v1/mcp/approvals", json=body)).json()

    def revoke_tool(self, identity: str, tool: str | None = None) -> dict:
        params = {"tool": tool} if tool else {}
        return self._checked(self._http.delete(f"/v1/mcp/approvals/{identity}",
                                               params=params)).json()

    # -- document collections (engine/api/admin/document_routes.py) ----------------------------

    def add_collection(self, name: str, paths: list[str]) -> dict:
        return self._checked(self._http.post("/v1/collections",
                                             json={"name": name, "paths": paths})).json()

    def collections(self) -> dict:
        return self._checked(self._http.get("/v1/collections")).json()

    def collection(self, name: str) -> dict:
        return self._checked(self._http.get(f"/v1/collections/{name}")).json()

    def search_collection(self, name: str, query: str, top_k: int = 5) -> list[dict]:
        body = {"query": query, "top_k": top_k}
        return self._checked(self._http.post(f"/v1/collections/{name}/search",
                                             json=body)).json()["data"]

    # -- speech (engine/api/wire_formats/audio_routes.py) ------------------------------------------

    def transcribe(self, audio: bytes, language: str | None = None) -> str:
        """A recording's words (any format the engine decodes)."""
        data = {"model": "whisper-1", **({"language": language} if language else {})}
        return self._checked(self._http.post("/v1/audio/transcriptions", data=data,
                                             files={"file": ("speech.wav", audio)})).json()["text"]

    def speech(self, text: str, voice: str = "alloy", speed: float = 1.0) -> bytes:
        """`text` spoken, as a WAV."""
        return self._checked(self._http.post("/v1/audio/speech", json={
            "model": "tts-1", "input": text, "voice": voice, "speed": speed,
            "response_format": "wav"})).content

    # -- sharing with the home (engine/api/admin/home_admin_routes.py) -----------------

    def home(self) -> dict:
        return self._checked(self._http.get("/v1/home")).json()

    def share(self, enabled: bool, host: str | None = None, port: int | None = None) -> dict:
        body = {"enabled": enabled, **({"host": host} if host else {}),
                **({"port": port} if port is not None else {})}
        return self._checked(self._http.put("/v1/home/share", json=body)).json()

    def add_device(self, name: str) -> dict:
        return self._checked(self._http.post("/v1/home/devices", json={"name": name})).json()

    def remove_device(self, name: str) -> dict:
        return self._checked(self._http.delete(f"/v1/home/devices/{quote(name, safe='')}")).json()

    def choose_for_home(self, **choices) -> dict:
        return self._checked(self._http.patch("/v1/home", json=choices)).json()

    def count_tokens(self, text: str, model: str | None = None) -> int:
        body = {"content": text, "model": model}
        return len(self._checked(self._http.post("/tokenize", json=body)).json()["tokens"])

    def close(self) -> None:
        self._http.close()


def _add_calls(calls: list[dict], pieces) -> None:
    """A stream's tool-call pieces joined into whole calls (OpenAI's `index` says whose)."""
    for piece in pieces:
        index = piece.get("index", len(calls))
        while len(calls) <= index:
            calls.append({"id": "", "name": "", "arguments": ""})
        function = piece.get("function") or {}
        calls[index]["id"] = piece.get("id") or calls[index]["id"]
        calls[index]["name"] += function.get("name") or ""
        calls[index]["arguments"] += function.get("arguments") or ""


def _load_body(model: str, n_ctx, gpu_layers, cpu_moe_layers, vision=None) -> dict:
    """A LoadRequest: the model and the user's choices over the planner's (None: its own;
    vision False: without its projector)."""
    return {"model": model, "n_ctx": n_ctx, "gpu_layers": gpu_layers,
            "cpu_moe_layers": cpu_moe_layers, "vision": vision}
