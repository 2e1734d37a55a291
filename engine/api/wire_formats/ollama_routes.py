"""Ollama's API, as its clients (Open WebUI, Continue, the `ollama` Python and JavaScript
clients) expect it: /api/tags, /api/show, /api/ps, /api/version, /api/chat and
/api/generate (NDJSON streaming, or one object), /api/embed and /api/embeddings.

A request becomes the same turn an OpenAI one does (turns.py): its `options` the
sampling fields, `format` ("json" or a JSON Schema) a response format, `tools` and
`tool_calls` the conversation's, `think` the reasoning settings; `keep_alive` how long
the model stays loaded (0 unloads it once idle, a negative value keeps it), and
`options.num_ctx` its context (a different one reloads it, as Ollama does). A model is
named by its id or as Ollama names it ("qwen3:30b-a3b", "qwen3" for "qwen3:latest").
Errors answer in Ollama's shape, {"error": "..."} (factory.py)."""

from __future__ import annotations

from collections import deque

import asyncio
from functools import partial
import json
import re
import time
from datetime import datetime, timezone
from typing import Any, AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, StreamingResponse

from ...conversation import images
from ...conversation.conversation import Conversation, Message, ToolCall, tool
from ...conversation.images import MARKER
from ... import status as engine_status
from ...engine import Engine
from ...errors import Forbidden, InvalidRequest, NotSupported
from ...formats.parsed import CallArgs, CallStart, Reasoning, Text
from .ollama_schemas import (OllamaChat, OllamaEmbed, OllamaEmbeddings, OllamaGenerate,
                             OllamaShow, keep_of, openai_body)
from ..schemas import tool_choice
from ..thinking import Thinking
from ..turns import Done, Turn, completion_turn, conversation_turn, guarded
from ..side_work import embedded
from ..side_work import turn_work
from ..wire import Caller, cancelled, cited, device_of, ollama_error

VERSION = "0.13.5"  # the Ollama API these routes answer as (clients check it for features:
# Codex's --oss wants 0.13.4 or newer, for /v1/responses on this port)
_QUANT = re.compile(r"(?:^|[-_.])((?:I?Q\d(?:_[A-Z0-9]+)*)|BF16|F16|F32)(?:[-_.]|$)",
                    re.IGNORECASE)


def router(engine: Engine) -> APIRouter:
    api = APIRouter()

    @api.api_route("/", methods=["GET", "HEAD"], response_class=PlainTextResponse)
    async def alive():
        return "Ollama is running"  # what apps check before they use the API

    @api.get("/api/version")
    async def version():
        return {"version": VERSION}

    @api.get("/api/tags")
    async def tags():
        return {"models": [_listed(engine, m) for m in engine.shelf.models()
                           if engine.shelf.kind_of(m) in ("chat", "embedding", None)]}

    @api.post("/api/show")
    async def show(body: OllamaShow):
        return await asyncio.to_thread(_shown, engine, engine.resolve(body.named()))

    @api.get("/api/ps")
    async def running():
        listed = {m.id: m for m in engine.shelf.models()}
        return {"models": [_running(engine, entry, listed.get(entry["id"]))
                           for entry in engine_status.loaded_models(engine)]}

    @api.post("/api/chat")
    async def chat(body: OllamaChat, http: Request):
        caller = Caller.of(http)
        turn = await turn_work(engine, caller, conversation_turn, engine, openai_body(body),
                               partial(_conversation, body), caller,
                               thinking=_thinking(body.think))
        return await _answer(engine, body, turn, "message")

    @api.post("/api/generate")
    async def generate(body: OllamaGenerate, http: Request):
        if body.suffix:
            raise InvalidRequest("suffix: filling in the middle is not supported", param="suffix")
        if body.template:
            raise InvalidRequest("template: Ollama's Go templates are not supported; the "
                                 "model's own chat template is used", param="template")
        if not body.prompt and not body.images:
            return await _load_or_unload(engine, body, http)
        if body.raw:  # the prompt as it is, no template
            if body.collections:
                raise InvalidRequest("collections: a raw prompt has no conversation to "
                                     "ground", param="collections")
            if body.images:
                raise InvalidRequest("images: a raw prompt cannot carry images (the "
                                     "model's template places them)", param="images")
            turn = completion_turn(engine, openai_body(body), body.prompt, Caller.of(http))
        else:
            caller = Caller.of(http)
            turn = await turn_work(engine, caller, conversation_turn, engine, openai_body(body),
                                   partial(_prompt_conversation, body), caller,
                                   thinking=_thinking(body.think))
        return await _answer(engine, body, turn, "response")

    @api.post("/api/embed")
    async def embed(body: OllamaEmbed, http: Request):
        model = engine.resolve(body.model)
        inputs = [body.input] if isinstance(body.input, str) else list(body.input)
        started = time.monotonic()
        vectors, tokens = await embedded(engine, model, inputs, http)
        if body.dimensions is not None and body.dimensions != vectors.shape[1]:
            raise InvalidRequest(f"{model.id} gives {vectors.shape[1]} dimensions",
                                 param="dimensions")
        return {"model": body.model, "embeddings": vectors.tolist(),
                "total_duration": _ns(time.monotonic() - started), "load_duration": 0,
                "prompt_eval_count": tokens}

    @api.post("/api/embeddings")
    async def embeddings(body: OllamaEmbeddings, http: Request):
        model = engine.resolve(body.model)
        vectors, _ = await embedded(engine, model, [body.prompt], http)
        return {"embedding": vectors[0].tolist()}

    for path, verb in (("pull", "download models from the Hub in Homerack (its window, or "
                                "`homerack pull`)"),
                       ("push", "push models"), ("create", "create models"),
                       ("copy", "copy models"), ("delete", "delete models")):
        api.add_api_route(f"/api/{path}", _not_here(verb), methods=["POST", "DELETE"],
                          include_in_schema=False)  # refusals, not routes
    return api


def openai_door(engine: Engine) -> APIRouter:
    """`GET /v1/models` as Ollama's own port answers it (the OpenAI-compatible list its
    clients probe: Codex's `--oss` looks for it before anything else); the other `/v1/*`
    routes on that port are the engine's own (api/server/factory.py's Ollama app)."""
    api = APIRouter()

    @api.get("/v1/models")
    async def models():
        return {"object": "list", "data": [
            {"id": model.id, "object": "model", "created": int(model.path.stat().st_mtime),
             "owned_by": "homerack"} for model in engine.shelf.models()
            if engine.shelf.kind_of(model) in ("chat", "embedding", None)]}

    return api


def _not_here(verb: str):
    async def refuse():
        raise NotSupported(f"Homerack's Ollama API does not {verb}")
    return refuse


# -- the conversation ---------------------------------------------------------------

def _conversation(body: OllamaChat) -> Conversation:
    """Ollama's messages as a conversation: its tool calls carry no ids, so each gets
    one, and a tool's result answers the earliest unanswered call of its name."""
    messages, waiting = [], _Unanswered()
    for i, m in enumerate(body.messages):
        where = f"messages[{i}]"
        calls = tuple(waiting.add(call.function.name, call.function.arguments)
                      for call in m.tool_calls or ())
        call_id = None
        if m.role == "tool":
            call_id = waiting.answer(m.tool_name)
            if call_id is None:
                raise InvalidRequest(f"{where}: a tool result answers no earlier tool call",
                                     param=where)
        text, pictures = _with_images(m.content or "", m.images, f"{where}.images")
        messages.append(Message(m.role, text, calls, call_id, where,
                                m.thinking or "", pictures))
    if not messages:
        raise InvalidRequest("messages is empty", param="messages")
    return Conversation(messages=tuple(messages), tools=_tools(body.tools),
                        choice=tool_choice(None), schema=body.schema())


class _Unanswered:
    """The calls no result has answered yet, in order and by name: each result finds its
    call in constant time (a scan per result was quadratic in a conversation's calls)."""

    def __init__(self):
        self._order: dict[str, str] = {}  # id -> name, oldest first
        self._by_name: dict[str, deque[str]] = {}
        self._n = 0

    def add(self, name: str, arguments: dict) -> ToolCall:
        self._n += 1
        call = ToolCall(f"call_{self._n}", name, arguments)
        self._order[call.id] = name
        self._by_name.setdefault(name, deque()).append(call.id)
        return call

    def answer(self, name: str | None) -> str | None:
        """The id of the earliest unanswered call of `name`, else of any; None: none."""
        named = self._by_name.get(name) if name is not None else None
        while named and named[0] not in self._order:  # answered by a result without name
            named.popleft()
        if named:
            call_id = named.popleft()
        elif self._order:
            call_id = next(iter(self._order))
        else:
            return None
        del self._order[call_id]
        return call_id


def _prompt_conversation(body: OllamaGenerate) -> Conversation:
    system = (Message("system", body.system, where="system"),) if body.system else ()
    text, pictures = _with_images(body.prompt or "", body.images, "images")
    return Conversation(messages=(*system, Message("user", text, where="prompt",
                                                   pictures=pictures)),
                        choice=tool_choice(None), schema=body.schema())


def _with_images(text: str, given: list[str] | None, where: str) -> tuple[str, tuple]:
    """A message's text with its images (base64, as Ollama sends them) before it, as
    Ollama places them."""
    pictures = tuple(images.from_base64(data, f"{where}[{i}]")
                     for i, data in enumerate(given or ()))
    return MARKER * len(pictures) + text, pictures


def _tools(tools) -> tuple:
    return tuple(tool(t.function.name, t.function.description, t.function.parameters,
                      f"tools[{i}].function.parameters") for i, t in enumerate(tools or ()))


def _thinking(think: bool | str | None) -> Thinking:
    """Ollama's `think`: true or false, or gpt-oss's "low", "medium", "high"."""
    effort = "none" if think is False else think if isinstance(think, str) else None
    return Thinking(separate=True, effort=effort)


# -- the answer ---------------------------------------------------------------------

async def _answer(engine: Engine, body, turn: Turn, field: str):
    started = time.monotonic()
    # before it starts: a context other than the loaded one reloads the model. A device
    # generates, it does not manage: its num_ctx and keep_alive are not asked (Ollama's
    # clients send them on every request; the owner's choices stand)
    if turn.caller.device is None:
        engine.ask(turn.request.model, body.options.num_ctx, keep_of(body.keep_alive))
    try:
        await turn.start()
    except asyncio.CancelledError:
        return cancelled()
    if body.stream is not False:
        return StreamingResponse(_chunks(turn, body.model, field, started),
                                 media_type="application/x-ndjson")
    try:
        got = await turn.collect()
    except asyncio.CancelledError:
        return cancelled()
    calls = [_call(start.name, args, i) for i, (start, args) in enumerate(got.calls)]
    thinking = {"thinking": got.reasoning} if got.reasoning else {}
    answer = {"response": got.text, **thinking} if field == "response" else \
        {"message": {"role": "assistant", "content": got.text, **thinking,
                     **({"tool_calls": calls} if calls else {})}}
    return {"model": body.model, "created_at": _now(), **answer, "done": True,
            "done_reason": _reason(got.done.reason), **_durations(got.done, started),
            **cited(turn)}


async def _chunks(turn: Turn, name: str, field: str, started: float) -> AsyncIterator[str]:
    calls: dict[int, list] = {}

    def line(payload: dict) -> str:
        return json.dumps({"model": name, "created_at": _now(), **payload}) + "\n"

    def part(text: str = "", thinking: str = "", tool_calls=None) -> str:
        if field == "response":
            return line({"response": text, **({"thinking": thinking} if thinking else {}),
                         "done": False})
        message = {"role": "assistant", "content": text,
                   **({"thinking": thinking} if thinking else {}),
                   **({"tool_calls": tool_calls} if tool_calls else {})}
        return line({"message": message, "done": False})

    async for event in guarded(turn, lambda error: json.dumps(ollama_error(error.message)) + "\n"):
        if isinstance(event, str):
            yield event
        elif isinstance(event, Text):
            yield part(event.text)
        elif isinstance(event, Reasoning):
            yield part(thinking=event.text)
        elif isinstance(event, CallStart):
            calls[event.index] = [event.name, []]
        elif isinstance(event, CallArgs):
            calls[event.index][1].append(event.text)
        elif isinstance(event, Done):
            if calls:
                yield part(tool_calls=[_call(name, "".join(args), i)
                                       for i, (name, args) in sorted(calls.items())])
            yield line({**_final(field), "done": True, "done_reason": _reason(event.reason),
                        **_durations(event, started), **cited(turn)})


def _call(name: str, arguments: str, index: int) -> dict:
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        parsed = {}
    return {"function": {"index": index, "name": name,
                         "arguments": parsed if isinstance(parsed, dict) else {}}}


def _final(field: str) -> dict:
    return {"response": ""} if field == "response" else \
        {"message": {"role": "assistant", "content": ""}}


def _reason(reason: str) -> str:
    return "length" if reason == "length" else "stop"


def _durations(done: Done, started: float) -> dict:
    usage = done.usage
    decode_s = usage.completion_tokens / usage.decode_tokens_per_s \
        if usage.decode_tokens_per_s else 0.0
    return {"total_duration": _ns(time.monotonic() - started), "load_duration": 0,
            "prompt_eval_count": usage.prompt_tokens,
            "prompt_eval_duration": _ns(usage.time_to_first_token_s),
            "eval_count": usage.completion_tokens, "eval_duration": _ns(decode_s)}


async def _load_or_unload(engine: Engine, body: OllamaGenerate, http: Request) -> dict:
    """An empty prompt loads the model (Ollama's preload), or with keep_alive 0 unloads it:
    the owner's to do, refused to a device."""
    if device_of(http) is not None:
        raise Forbidden("prompt: an empty prompt loads or unloads a model, which the owner "
                        "manages; a device sends a prompt", param="prompt")
    model = engine.resolve(body.model)
    keep = keep_of(body.keep_alive)
    if keep is not None and keep.ttl_s == 0:
        await asyncio.to_thread(engine.unload, model.id)
        reason = "unload"
    else:
        from ...events import Failed
        from ..channel import Channel

        engine.ask(model, body.options.num_ctx, keep)
        channel = Channel()
        job = await asyncio.to_thread(engine.preload, model, channel.emit, False)
        event = await channel.next(job, http.is_disconnected)
        if isinstance(event, Failed):
            raise event.error
        reason = "load"
    return {"model": body.model, "created_at": _now(), "response": "", "done": True,
            "done_reason": reason}


# -- the models ---------------------------------------------------------------------

def _listed(engine: Engine, model) -> dict:
    return {"name": _name(model), "model": _name(model), "modified_at": _modified(model),
            "size": model.size_bytes, "digest": model.digest or _pseudo_digest(model),
            "details": _details(engine, model)}


def _name(model) -> str:
    return model.label if model.source == "ollama" else model.id


def _details(engine: Engine, model) -> dict:
    facts = engine.shelf.header(model)
    arch = facts.architecture if facts else None
    n_params = facts.shape.n_params if facts and facts.shape else None
    quant = _QUANT.search(model.label.rsplit(":", 1)[-1] or model.path.name) or \
        _QUANT.search(model.path.name)
    return {"parent_model": "", "format": "gguf", "family": arch,
            "families": [arch] if arch else None,
            "parameter_size": _params_text(n_params) if n_params else "",
            "quantization_level": quant.group(1).upper() if quant else ""}


def _shown(engine: Engine, model) -> dict:
    facts = engine.shelf.header(model)
    kind = engine.shelf.kind_of(model) or "chat"
    can = set(engine.shelf.facts(model, kind).get("capabilities") or ())
    capabilities = ["embedding"] if kind == "embedding" else \
        ["completion", *(["tools"] if "tools" in can else []),
         *(["thinking"] if "reasoning" in can else []), *(["vision"] if "vision" in can else [])]
    params = "\n".join(f"{k} {json.dumps(x) if isinstance(x, str) else x}"
                       for k, v in model.params for x in (v if isinstance(v, tuple) else (v,)))
    info: dict[str, Any] = {}
    if facts is not None:
        info = {"general.architecture": facts.architecture, "general.name": facts.name,
                f"{facts.architecture}.context_length": facts.context_length,
                f"{facts.architecture}.block_count": facts.block_count,
                **({"general.parameter_count": facts.shape.n_params} if facts.shape else {})}
    return {"modelfile": f"# Homerack: {model.id}, used where it lies\nFROM {model.path}\n",
            "parameters": params, "template": model.template or
            (facts.chat_template if facts else "") or "",
            **({"system": model.system} if model.system else {}),
            "details": _details(engine, model), "model_info": info,
            "capabilities": capabilities, "modified_at": _modified(model)}


def _running(engine: Engine, entry: dict, model) -> dict:
    """A loaded model as /api/ps shows it; `model` None when its file is no longer
    listed (deleted, its source turned off) while it is still loaded."""
    memory = entry["memory"]
    ttl = entry["ttl_s"]
    expires = "0001-01-01T00:00:00Z" if entry["pinned"] or ttl is None else \
        _iso(time.time() + max(0.0, ttl - entry["idle_s"]))
    name = _name(model) if model else entry["id"]
    return {"name": name, "model": name, "size": sum(memory.values()),
            "digest": (model.digest or _pseudo_digest(model)) if model else "",
            "details": _details(engine, model) if model else {"format": "gguf"},
            "expires_at": expires,
            "size_vram": sum(v for k, v in memory.items() if k != "CPU"),
            "context_length": entry["n_ctx"]}


def _pseudo_digest(model) -> str:
    """Not the file's sha256 (hashing 20 GB to list it costs minutes): a stable id of
    the model where its place names no digest."""
    import hashlib

    return hashlib.sha256(f"{model.path}:{model.size_bytes}".encode()).hexdigest()


def _params_text(n: float) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M"


def _modified(model) -> str:
    try:
        return _iso(model.path.stat().st_mtime)
    except OSError:
        return _iso(0)


def _now() -> str:
    return _iso(time.time())


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat().replace("+00:00", "Z")


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)

