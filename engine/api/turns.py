"""One generation as the routes see it: started, then text and tool calls as they come,
then done. The OpenAI, Anthropic and Responses routes only translate these events into
their wire shapes."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Callable

from fastapi import Request

from ..conversation import images
from ..conversation.compose import compose
from ..conversation.conversation import Conversation, checked
from ..conversation.json_schema import MAX_GRAMMAR, MAX_NESTING, nesting
from ..formats.parsed import CallArgs, CallStart, Reasoning, Text
from ..formats.stream import FormatStream, Reading
from ..engine import Engine
from ..errors import HomerackError, InvalidRequest, ModelNotFound, StoppedBeforeStart
from ..events import Delta, Failed, Finished, GenerationRequest, Started, Usage
from .channel import Channel
from .grounding import ground
from .schemas import Groundable
from .thinking import Thinking
from .wire import device_of


@dataclass(frozen=True)
class Done:
    reason: str  # "stop", "length", "cancelled" or "tool_calls"
    usage: Usage


@dataclass
class Collected:
    """A whole answer: its text, its reasoning, its calls (start, arguments' JSON text),
    how it ended."""
    text: str = ""
    reasoning: str = ""
    calls: list[tuple[CallStart, str]] = field(default_factory=list)
    done: Done | None = None


class Turn:
    def __init__(self, engine: Engine, request: GenerationRequest, http: Request,
                 reading: Reading | None = None):
        self.engine, self.request, self.http, self.reading = engine, request, http, reading
        self.reader: FormatStream | None = None
        self.started: Started | None = None
        self.notes: list[str] = []  # for the answer, beside the engine's own
        self.citations: list[dict] | None = None  # grounding.py's, when collections were asked
        self.job = None  # once submitted
        self._cancelled = False  # a Stop that came while it was being submitted

    async def start(self) -> Started:
        """Submit and wait for the first token (an error before it raises here, so a
        route can still answer with an HTTP error status)."""
        self.channel = Channel()
        request = replace(self.request, response_cache=cache_mode(
            self.http.headers.get("cache-control", ""), self.request.response_cache),
            client=device_of(self.http))
        # off the event loop: a cache lookup renders the prompt and may read the model's
        # header the first time
        self.job = await asyncio.to_thread(self.engine.submit, request, self.channel.emit)
        if self._cancelled:
            self.job.cancel()
        first = await self.channel.next(self.job, self.http)
        if isinstance(first, Failed):
            raise first.error
        if isinstance(first, Finished):  # stopped (cancel) before its first token
            raise StoppedBeforeStart("stopped before the answer began")
        self.started = first
        if self.reading is not None:  # the prompt as rendered says whether it opened thinking
            self.reader = FormatStream(replace(
                self.reading, opened=self.job.request.rendered.opens_thinking()))
        return first

    def cancel(self) -> None:
        """Stops generation (a no-op when finished); before the job exists, it is stopped
        as soon as it is submitted."""
        self._cancelled = True
        if self.job is not None:
            self.job.cancel()

    async def events(self) -> AsyncIterator[Text | Reasoning | CallStart | CallArgs | Done]:
        """Raises the engine's error if generation fails midway."""
        while True:
            event = await self.channel.next(self.job, self.http)
            if isinstance(event, Delta):
                for out in self._read(event.text):
                    yield out
            elif isinstance(event, Failed):
                raise event.error
            elif isinstance(event, Finished):
                for out in self.reader.finish() if self.reader else ():
                    yield out
                reason = event.finish_reason
                if self.reader and self.reader.ids and reason == "stop":
                    reason = "tool_calls"
                yield Done(reason, event.usage)
                return

    def _read(self, text: str) -> list:
        return self.reader.feed(text) if self.reader else [Text(text)]

    async def collect(self) -> Collected:
        out, parts, thoughts, starts, args = Collected(), [], [], [], {}
        async for event in self.events():
            if isinstance(event, Text):
                parts.append(event.text)
            elif isinstance(event, Reasoning):
                thoughts.append(event.text)
            elif isinstance(event, CallStart):
                starts.append(event)
                args[event.index] = []
            elif isinstance(event, CallArgs):
                args[event.index].append(event.text)
            elif isinstance(event, Done):
                out.done = event
        out.text, out.reasoning = "".join(parts), "".join(thoughts)
        out.calls = [(start, "".join(args[start.index])) for start in starts]
        return out


def cache_mode(cache_control: str, asked: str) -> str:
    """The response cache's use for a request: HTTP's Cache-Control directives over the
    body's field (no-store: neither read nor write; no-cache: answer afresh, keep it)."""
    directives = {part.strip().lower() for part in cache_control.split(",")}
    if "no-store" in directives or asked == "off":
        return "off"
    return "refresh" if "no-cache" in directives or asked == "refresh" else "use"


def request_for(engine: Engine, body, **content) -> GenerationRequest:
    """The engine request for a body of any of the APIs (they share the sampling fields
    and Homerack's extensions, see schemas.SamplingFields)."""
    default = engine.default_model()
    routed = body.model == "auto"
    named, adapters = split_model_id(engine, body.model)
    if routed and body.lora:
        raise InvalidRequest("adapters apply to a named model, not to \"auto\"", param="lora")
    model = engine.router.auto_model() if routed else \
        engine.resolve(named) if named or not default else default
    draft, speculation = None, body.speculation
    if body.draft_model:
        speculation = speculation or "draft"
        if body.draft_model != "auto":
            try:
                draft = engine.resolve(body.draft_model)
            except ModelNotFound as exc:
                raise ModelNotFound(exc.message, param="draft_model") from None
            engine.check_draft(model, draft)
    return GenerationRequest(model=model, max_tokens=body.token_limit(),
                             sampling=body.sampling(engine.sampling_defaults(model)),
                             stop=body.stop_strings() or model.stops(),
                             grammar=checked_grammar(body.grammar),
                             ignore_eos=body.ignore_eos, speculation=speculation,
                             draft_model=draft, cache_prompt=body.cache_prompt, routed=routed,
                             response_cache=body.response_cache,
                             adapters=engine.adapter_uses(model, adapters + lora_of(
                                 engine, body.lora)), **content)


def split_model_id(engine: Engine, name: str | None) -> tuple[str | None, list]:
    """A model id `BASE+ADAPTER[+ADAPTER...]` (for clients that send only a model name)
    as the base and its adapters at scale 1; any other id as it is."""
    if not name or "+" not in name or name in {m.id for m in engine.shelf.models()}:
        return name, []
    base, *adapters = name.split("+")
    return base, [(adapter, 1.0) for adapter in adapters]


def lora_of(engine: Engine, choices) -> list[tuple[str, float]]:
    """The body's `lora` as (adapter id, scale); a number is an index into
    GET /lora-adapters, as llama-server's ids are."""
    if not choices:
        return []
    listed = engine.shelf.adapters()
    out = []
    for choice in choices:
        if isinstance(choice.id, int):
            if not 0 <= choice.id < len(listed):
                raise ModelNotFound(f"no adapter has index {choice.id} "
                                    f"({len(listed)} adapters are listed)", param="lora")
            out.append((listed[choice.id].id, choice.scale))
        else:
            out.append((choice.id, choice.scale))
    return out


def conversation_turn(engine: Engine, body: Groundable,
                      conv: Conversation | Callable[[], Conversation],
                      http: Request,
                      choice_param: str = "tool_choice", id_prefix: str = "call_",
                      thinking: Thinking = Thinking()) -> Turn:
    """A turn of a conversation, with or without tools: rendered in the form of the
    model's family (engine/formats), its output constrained where the choice, the schema
    or the request's own grammar demands it, and read back in that family's format.
    `conv` may be the function that reads it from the body: its images are decoded here,
    on a worker thread, not on the event loop."""
    conv = checked(conv() if callable(conv) else conv, choice_param)
    grounded = ground(engine, body.collections, conv, http) if body.collections else None
    conv = grounded.conversation if grounded else conv
    request = request_for(engine, body)
    family = engine.chat_format_of(request.model).family
    composed = compose(conv, family, separate=thinking.separate, id_prefix=id_prefix)
    pictures = tuple(p for m in conv.messages for p in m.pictures)
    # in number and pixels, before any is decoded; those encoded before are free
    images.check_request(pictures, engine.encoded_pictures(request.model))
    request = replace(request, messages=composed.messages, tools=composed.tools,
                      pictures=pictures,
                      grammar=request.grammar or engine.grammar(composed),
                      template_kwargs=thinking.template_kwargs(),
                      thinking_budget=thinking.budget)
    reading = composed.reading
    needs_reader = reading.schemas is not None or family.think or family.drop or \
        family.is_harmony
    turn = Turn(engine, request, http, reading if needs_reader else None)
    turn.notes = conv.notes() + list(composed.notes) + (grounded.notes if grounded else [])
    turn.citations = grounded.citations if grounded else None
    return turn


def checked_grammar(text: str | None) -> str | None:
    """A request's own GBNF grammar (llama-server's `grammar`), bounded as the ones made
    from schemas are; llama.cpp's parser has the last word when it starts."""
    if text is None:
        return None
    if not text.strip():
        raise InvalidRequest("grammar is empty", param="grammar")
    if len(text) > MAX_GRAMMAR:
        raise InvalidRequest(f"grammar is {len(text):,} characters; at most {MAX_GRAMMAR:,}",
                             param="grammar")
    if (depth := nesting(text)) > MAX_NESTING:
        raise InvalidRequest(f"grammar nests {depth:,} groups deep; at most {MAX_NESTING:,}",
                             param="grammar")
    return text


async def guarded(turn: Turn, error_event: Callable[[HomerackError], str]):
    """A turn's events for a stream: a failure midway becomes a last event in the API's
    own error shape (a string), and a client that leaves stops generation."""
    try:
        async for event in turn.events():
            yield event
    except HomerackError as error:
        yield error_event(error)
    finally:
        turn.cancel()
