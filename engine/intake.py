"""A request taken in, in one place: what it asked (`events.Asked`, built purely by its
wire format) and its conversation or prompt become the engine's `GenerationRequest`, as
vLLM's InputProcessor does for its engine. The model resolved ("auto" routed, an id
`BASE+ADAPTER` split, none asked: the default), the draft model checked, the model's
sampling defaults under what was asked, its stops, the adapters; a conversation composed
in the model's family, its pictures checked against the caps (those the model encoded
before are free), its grammar made, and how to read the answer back. A chat that asks
for it (`fit_pictures`: the desktop's and the web chat's) is fitted to the context: its
older pictures left out, each said so in its place, while the conversation with them
would leave the answer no room.

It reads the engine's parts by attribute (the store, the shelf, the router, the fleet),
as status.py does, so it stands beside engine.py in the layers contract.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .catalog.chat_format import chat_format_for
from .catalog.drafts import check_draft_fits, check_size
from .catalog.facts import image_tokens
from .catalog.models import LocalModel
from .catalog.sampling_defaults import model_defaults
from .conversation import images
from .conversation.compose import compose
from .conversation.conversation import Conversation, Message
from .errors import HomerackError, InvalidRequest, ModelNotFound
from .events import Asked, GenerationRequest, SamplingParams
from .formats.stream import Reading
from .llama.grammar import composed_grammar

# An answer's room when a chat's pictures are fitted and it names no max_tokens: a
# quarter of the context, up to this.
ANSWER_ROOM = 1024
LEFT_OUT = "[an earlier picture, left out]"


@dataclass(frozen=True)
class Taken:
    """A request ready for `Engine.submit`, with how to read its answer back (None: as
    plain text) and the notes its composition left for the answer."""
    request: GenerationRequest
    reading: Reading | None = None
    notes: tuple[str, ...] = ()


def take(engine, asked: Asked, conversation: Conversation | None = None,
         prompt: str | list[str] | None = None) -> Taken:
    """`asked` with a conversation (a chat turn) or a raw prompt (completions)."""
    request = _request(engine, asked)
    if conversation is None:
        return Taken(replace(request, prompt=prompt))
    family = chat_format_for(engine.store.inspector.inspect(request.model.path)).family
    capped = 0
    if asked.fit_pictures:  # older pictures the engine has not seen, over the caps: out
        conversation, capped = _within_caps(conversation, _encoded_pictures(
            engine, request.model))
    taken = _composed(engine, asked, conversation, family, request)
    if asked.fit_pictures and (taken.request.pictures or capped):
        fitted, left_out, context = _fitted(engine, asked, conversation, taken.request)
        if left_out:
            taken = _composed(engine, asked, fitted, family, request)
        if left_out or capped:
            taken = replace(taken, notes=(*taken.notes, _left_out_note(
                capped + left_out, context, capped)))
    return taken


def _within_caps(conversation: Conversation, known) -> tuple[Conversation, int]:
    """The conversation with its oldest pictures left out (never the last message's)
    while the pictures the engine has not encoded pass the caps (a history after a
    restart, or an import: none encoded yet); how many went."""
    older = conversation.messages[:-1]
    places = [(i, j, p) for i, m in enumerate(older) for j, p in enumerate(m.pictures)]
    dropped: set[tuple[int, int]] = set()
    for i, j, _picture in places:
        kept = tuple(p for k, m in enumerate(conversation.messages)
                     for n, p in enumerate(m.pictures) if (k, n) not in dropped)
        try:
            images.check_request(kept, known)
            break
        except InvalidRequest:
            dropped.add((i, j))
    return _leaving_out(conversation, dropped), len(dropped)


def _composed(engine, asked: Asked, conversation: Conversation, family,
              request: GenerationRequest) -> Taken:
    """The conversation composed in the model's family into the request."""
    composed = compose(conversation, family, separate=asked.separate_thinking,
                       id_prefix=asked.id_prefix)
    pictures = tuple(p for m in conversation.messages for p in m.pictures)
    # in number and pixels, before any is decoded; those encoded before are free
    images.check_request(pictures, _encoded_pictures(engine, request.model))
    request = replace(request, messages=composed.messages, tools=composed.tools,
                      pictures=pictures,
                      grammar=request.grammar or composed_grammar(composed, "tools"),
                      template_kwargs=asked.template_kwargs,
                      thinking_budget=asked.thinking_budget)
    reading = composed.reading
    needs_reader = reading.schemas is not None or family.think or family.drop or \
        family.is_harmony
    return Taken(request, reading if needs_reader else None, tuple(composed.notes))


def _fitted(engine, asked: Asked, conversation: Conversation,
            request: GenerationRequest) -> tuple[Conversation, int, int]:
    """The conversation with its oldest pictures left out (never the last message's)
    until its prompt leaves the answer its room; how many went, and the context."""
    context = _context(engine, request.model)
    if context is None:
        return conversation, 0, 0
    if not request.pictures:
        return conversation, 0, context
    room = asked.max_tokens or min(ANSWER_ROOM, context // 4)
    over = engine.count_prompt_tokens(request) + room - context
    if over <= 0:
        return conversation, 0, context
    # in steps of an eighth of the context: the turns that follow leave out the same
    # pictures until the next step, so their prompts keep the cached prefix
    step = max(1, context // 8)
    over = -(-over // step) * step
    placeholder = len(engine.tokenize(request.model, LEFT_OUT))
    dropped: set[tuple[int, int]] = set()
    older = conversation.messages[:-1]
    for i, message in enumerate(older):
        for j, picture in enumerate(message.pictures):
            if over <= 0:
                break
            dropped.add((i, j))
            over -= image_tokens(request.model, (picture,)) - placeholder
    return _leaving_out(conversation, dropped), len(dropped), context


def _leaving_out(conversation: Conversation, dropped: set[tuple[int, int]]) -> Conversation:
    """The conversation without its pictures at `dropped` (message, picture)."""
    if not dropped:
        return conversation
    return replace(conversation, messages=tuple(
        _without(m, {j for k, j in dropped if k == i})
        for i, m in enumerate(conversation.messages)))


def _without(message: Message, dropped: set[int]) -> Message:
    """The message with its pictures at `dropped` (their order) said left out."""
    if not dropped:
        return message
    parts = message.content.split(images.MARKER)
    content = parts[0] + "".join((LEFT_OUT if j in dropped else images.MARKER) + part
                                 for j, part in enumerate(parts[1:]))
    return replace(message, content=content, pictures=tuple(
        p for j, p in enumerate(message.pictures) if j not in dropped))


def _context(engine, model: LocalModel) -> int | None:
    """The context a request for `model` gets: the loaded one's, or the planned one's."""
    lane = engine.fleet.holding(model)
    loaded = lane.host.loaded if lane is not None else None
    if loaded is not None and loaded.model.path == model.path:
        return loaded.llama.n_ctx
    try:
        plan = engine.plan_for(model)
    except HomerackError:
        return None
    return getattr(plan, "n_ctx", None)


def _left_out_note(count: int, context: int, capped: int) -> str:
    """Said in the answer's notes (the desktop and the web chat show notes that begin
    with "left out:"), with why: the caps on new pictures, the context, or both."""
    pictures = "an earlier picture" if count == 1 else f"{count} earlier pictures"
    why = [f"a turn brings at most {images.MAX_PICTURES} pictures new to the engine"] \
        if capped else []
    if count > capped:
        why.append(f"the {context:,}-token context holds the rest and the answer")
    return f"left out: {pictures} ({'; '.join(why)})"


def _request(engine, asked: Asked) -> GenerationRequest:
    routed = asked.model == "auto"
    named, adapters = _split_model_id(engine, asked.model)
    if routed and asked.lora:
        raise InvalidRequest("adapters apply to a named model, not to \"auto\"", param="lora")
    default = engine.default_model()
    model = engine.router.auto_model() if routed else \
        engine.resolve(named) if named or not default else default
    draft, speculation = None, asked.speculation
    if asked.draft_model:
        speculation = speculation or "draft"
        if asked.draft_model != "auto":
            try:
                draft = engine.resolve(asked.draft_model)
            except ModelNotFound as exc:
                raise ModelNotFound(exc.message, param="draft_model") from None
            check_draft_fits(model, draft, engine.store.inspector)  # the tokenizer's first
            check_size(model, draft)
    return GenerationRequest(model=model, max_tokens=asked.max_tokens,
                             sampling=asked.sampling(_sampling_defaults(engine, model)),
                             stop=asked.stop or model.stops(), grammar=asked.grammar,
                             ignore_eos=asked.ignore_eos, speculation=speculation,
                             draft_model=draft, cache_prompt=asked.cache_prompt,
                             routed=routed, response_cache=asked.response_cache,
                             adapters=engine.store.adapter_uses(
                                 model, adapters + _lora(engine, asked.lora)))


def _split_model_id(engine, name: str | None) -> tuple[str | None, list]:
    """A model id `BASE+ADAPTER[+ADAPTER...]` (for clients that send only a model name)
    as the base and its adapters at scale 1; any other id as it is."""
    if not name or "+" not in name or name in {m.id for m in engine.shelf.models()}:
        return name, []
    base, *adapters = name.split("+")
    return base, [(adapter, 1.0) for adapter in adapters]


def _lora(engine, choices) -> list[tuple[str, float]]:
    """The asked adapters as (adapter id, scale); a number is an index into
    GET /lora-adapters, as llama-server's ids are."""
    if not choices:
        return []
    listed = engine.shelf.adapters()
    out = []
    for choice, scale in choices:
        if isinstance(choice, int):
            if not 0 <= choice < len(listed):
                raise ModelNotFound(f"no adapter has index {choice} "
                                    f"({len(listed)} adapters are listed)", param="lora")
            out.append((listed[choice].id, scale))
        else:
            out.append((choice, scale))
    return out


def _sampling_defaults(engine, model: LocalModel) -> SamplingParams:
    """What a request for `model` that leaves sampling out is sampled with."""
    chosen = model_defaults(engine.store.inspector.inspect(model.path), model.params)
    return SamplingParams(chosen.temperature, chosen.top_p, chosen.top_k, chosen.min_p,
                          frequency_penalty=chosen.frequency_penalty)


def _encoded_pictures(engine, model: LocalModel):
    """Whether the model, as loaded now, has encoded a picture (by its file's hash): the
    picture caps leave those out (a conversation resends its history)."""
    lane = engine.fleet.holding(model)
    loaded = lane.host.loaded if lane is not None else None
    if loaded is None or loaded.model.path != model.path:  # (not loaded yet)
        return lambda _digest: False
    cache = loaded.vision.images
    return cache.knows if cache is not None else (lambda _digest: False)
