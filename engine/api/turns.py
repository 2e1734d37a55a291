"""One generation as the routes see it: started, then text and tool calls as they come,
then done. The OpenAI, Anthropic and Responses routes only translate these events into
their wire shapes."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import AsyncIterator, Callable


from ..conversation.conversation import Conversation, checked, known_tools
from ..formats.parsed import CallArgs, CallStart, Reasoning, Text
from ..formats.stream import FormatStream, Reading
from ..engine import Engine
from ..errors import HomerackError, StoppedBeforeStart
from ..events import Asked, Delta, Failed, Finished, GenerationRequest, Started, Usage
from .channel import Channel
from .grounding import ground
from .schemas import Groundable
from .side_work import callers_threads
from .thinking import Thinking
from .wire import Caller


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
    def __init__(self, engine: Engine, request: GenerationRequest, caller: Caller,
                 reading: Reading | None = None):
        self.engine, self.request, self.caller, self.reading = engine, request, caller, reading
        self.reader: FormatStream | None = None
        self.started: Started | None = None
        self.notes: list[str] = []  # for the answer, beside the engine's own
        self.citations: list[dict] | None = None  # grounding.py's, when collections were asked
        self.job = None  # once submitted
        self.tools = ()  # the conversation's, kept as checked once the turn has started
        self._cancelled = False  # a Stop that came while it was being submitted

    async def start(self) -> Started:
        """Submit and wait for the first token (an error before it raises here, so a
        route can still answer with an HTTP error status)."""
        self.channel = Channel()
        request = replace(self.request, response_cache=cache_mode(
            self.caller.cache_control, self.request.response_cache),
            client=self.caller.client)
        # off the event loop: a cache lookup renders the prompt and may read the model's
        # header the first time, and the prompt is tokenized; a guest's on its own threads
        self.job = await callers_threads(self.caller, self.engine.submit, request,
                                         self.channel.emit)
        if self._cancelled:
            self.job.cancel()
        first = await self.channel.next(self.job, self.caller.gone)
        if isinstance(first, Failed):
            raise first.error
        if isinstance(first, Finished):  # stopped (cancel) before its first token
            raise StoppedBeforeStart("stopped before the answer began")
        self.started = first
        known_tools.remember(self.tools)
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
            event = await self.channel.next(self.job, self.caller.gone)
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


def completion_turn(engine: Engine, body, prompt, caller: Caller) -> Turn:
    """A raw prompt's turn (completions): the body's asked value taken by the engine."""
    return Turn(engine, engine.take(body.asked(), prompt=prompt).request, caller)


def conversation_turn(engine: Engine, body: Groundable,
                      conv: Conversation | Callable[[], Conversation],
                      caller: Caller,
                      choice_param: str = "tool_choice", id_prefix: str = "call_",
                      thinking: Thinking = Thinking()) -> Turn:
    """A turn of a conversation, with or without tools: checked, grounded, then taken by
    the engine in one call (intake.py: rendered in the form of the model's family, its
    output constrained where the choice, the schema or the request's own grammar demands
    it) and read back in that family's format. `conv` may be the function that reads it
    from the body: its images are decoded here, on a worker thread, not on the event loop."""
    return asked_turn(engine, body.asked(thinking, choice_param, id_prefix), conv, caller,
                      body.collections)


def asked_turn(engine: Engine, asked: Asked, conv: Conversation | Callable[[], Conversation],
               caller: Caller, collections: list[str] | None = None) -> Turn:
    """A conversation's turn from what was asked (the web chat builds its `Asked` and
    its conversation from stored rows, no request body)."""
    conv = checked(conv() if callable(conv) else conv, asked.choice_param)
    grounded = ground(engine, collections, conv, caller.client) if collections else None
    conv = grounded.conversation if grounded else conv
    taken = engine.take(asked, conv)
    turn = Turn(engine, taken.request, caller, taken.reading)
    turn.tools = conv.tools
    turn.notes = conv.notes() + list(taken.notes) + (grounded.notes if grounded else [])
    turn.citations = grounded.citations if grounded else None
    return turn


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
