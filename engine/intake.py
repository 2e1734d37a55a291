"""A request taken in, in one place: what it asked (`events.Asked`, built purely by its
wire format) and its conversation or prompt become the engine's `GenerationRequest`, as
vLLM's InputProcessor does for its engine. The model resolved ("auto" routed, an id
`BASE+ADAPTER` split, none asked: the default), the draft model checked, the model's
sampling defaults under what was asked, its stops, the adapters; a conversation composed
in the model's family, its pictures checked against the caps (those the model encoded
before are free), its grammar made, and how to read the answer back.

It reads the engine's parts by attribute (the store, the shelf, the router, the fleet),
as status.py does, so it stands beside engine.py in the layers contract.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .catalog.chat_format import chat_format_for
from .catalog.drafts import check_draft_fits, check_size
from .catalog.models import LocalModel
from .catalog.sampling_defaults import model_defaults
from .conversation import images
from .conversation.compose import compose
from .conversation.conversation import Conversation
from .errors import InvalidRequest, ModelNotFound
from .events import Asked, GenerationRequest, SamplingParams
from .formats.stream import Reading
from .llama.grammar import composed_grammar


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
