"""What goes into the engine and what comes out: requests, jobs and the small frozen
events a job's `emit` callback receives (Started, then Deltas, then Finished or Failed).
Events are called from the engine's worker thread."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from .errors import HomerackError
from .catalog.chat_format import ChatFormat
from .catalog.models import AdapterUse, LocalModel

# Logit rows one evaluation keeps (llama_context_params.n_outputs_max, set by the runtime,
# counted by the planner): one per prompt chunk, or one per verified draft position; 32
# covers the longest draft.
MAX_OUTPUTS = 32
# The client of the requests through the tokenless Ollama door (serve --ollama-port): any
# program on this computer, so none of the owner's cached prompts or answers (they would
# tell it, in cached_tokens and speed, what the owner asked), though no paired device
# either. A device's name cannot hold a colon (home/devices.py).
LOCAL_DOOR = "local:ollama-door"


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0


@dataclass(frozen=True)
class Asked:
    """What a request asked, as its wire format stated it, before the engine resolves any
    of it: built purely from the body by each API (schemas.SamplingFields.asked), turned
    with the conversation into a GenerationRequest by one engine call (intake.py)."""
    model: str | None = None  # an id, "auto", "BASE+ADAPTER", or None (the default model)
    max_tokens: int | None = None
    temperature: float | None = None  # None: the model's default (so for the rest)
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float = 0.0
    stop: tuple[str, ...] = ()
    grammar: str | None = None  # the request's own GBNF (bounded by the schema)
    ignore_eos: bool = False
    speculation: str | None = None
    draft_model: str | None = None  # an id or "auto"
    cache_prompt: bool = True
    response_cache: str = "use"
    lora: tuple[tuple[str | int, float], ...] = ()  # (adapter id or list index, scale)
    separate_thinking: bool = True  # the reasoning apart from the answer
    template_kwargs: dict = field(default_factory=dict)  # given to the chat template
    thinking_budget: int | None = None
    choice_param: str = "tool_choice"  # the body's name for the tool choice (errors name it)
    id_prefix: str = "call_"  # of the tool calls' ids, in the API's style
    fit_pictures: bool = False  # older pictures left out where the context is full (intake)

    def sampling(self, defaults: SamplingParams) -> SamplingParams:
        """The sampling asked; what it leaves out comes from `defaults` (the model's)."""
        return SamplingParams(
            temperature=defaults.temperature if self.temperature is None else self.temperature,
            top_p=self.top_p or defaults.top_p,
            top_k=defaults.top_k if self.top_k is None else self.top_k,
            min_p=defaults.min_p if self.min_p is None else self.min_p,
            seed=self.seed,
            # the model's penalty goes with its temperature (greedy needs it against loops):
            # a request that picks its temperature picks its own penalty
            frequency_penalty=self.frequency_penalty if self.frequency_penalty is not None
            else defaults.frequency_penalty if self.temperature is None else 0.0,
            presence_penalty=self.presence_penalty,
        )


@dataclass(frozen=True)
class Rendered:
    """A chat as its model's prompt: rendered once, where the engine takes the request
    (Engine.submit), in the format it was rendered with, and carried from there: nothing
    downstream renders it or looks its format up again."""
    text: str
    chat_format: ChatFormat

    def opens_thinking(self) -> bool:
        """The prompt itself opened the model's reasoning (its template wrote the marker)."""
        return self.chat_format.family.opens_thinking(self.text)


@dataclass(frozen=True)
class GenerationRequest:
    model: LocalModel
    messages: tuple[dict, ...] | None = None  # a chat, rendered with the model's template
    prompt: str | None = None                 # or a raw completion prompt
    max_tokens: int | None = None
    sampling: SamplingParams = SamplingParams()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    speculation: str | None = None  # "off", "lookup" or "draft"; None: the engine default
    draft_model: LocalModel | None = None  # None with "draft": picked automatically
    cache_prompt: bool = True  # False: evaluate the whole prompt afresh (as llama-server)
    tools: tuple[dict, ...] | None = None  # given to the chat template with the messages
    grammar: str | None = None  # GBNF the output must match (llama.cpp's grammar sampler)
    routed: bool = False  # model "auto": the engine picks small or large (routing.py)
    escalate_to: LocalModel | None = None  # cascade: answers instead when `model` is unsure,
    escalate_below: float = 0.0            # that is, when its confidence is under this
    measure_confidence: bool = False  # report the sampled tokens' probabilities (Usage)
    response_cache: str = "use"  # "use", "refresh" (answer afresh, keep it) or "off"
    rendered: Rendered | None = None  # the chat in `model`'s format, made by Engine.submit
    adapters: tuple[AdapterUse, ...] = ()  # LoRA adapters over `model`, checked, sorted
    template_kwargs: dict = field(default_factory=dict)  # to the chat template (thinking...)
    thinking_budget: int | None = None  # reasoning tokens at most, then its closing marker
    pictures: tuple = ()  # conversation.images.Picture, in the order of the markers in the messages
    tokens: tuple[int, ...] | None = None  # the prompt's, tokenized by Engine.submit
    client: str | None = None  # the paired device that asked (engine/home), or LOCAL_DOOR;
                               # None: the owner (its KV, prompt and answer caches its own)
    precedence: bool = False   # admitted before the devices' (the owner's, when chosen)

    @property
    def adapter_set(self) -> tuple[tuple[str, float], ...]:
        """What a KV state computed for this request depends on beside the model: the
        adapters' files and scales (empty: the model alone)."""
        return tuple((str(use.adapter.path), use.scale) for use in self.adapters)

    @property
    def generates(self) -> bool:
        """False for a preload: a request with nothing to generate."""
        return self.messages is not None or self.prompt is not None


@dataclass(frozen=True)
class Started:
    model: str
    prompt_tokens: int
    cached_tokens: int
    max_tokens: int
    n_ctx: int
    chat_format: str | None
    notes: tuple[str, ...]
    response_cache: str | None = None  # "hit", "miss" or "bypass"; None: not cacheable
    route: dict | None = None  # how "auto" chose the model that answers
    adapters: tuple[dict, ...] = ()  # the LoRA adapters that answered ({"id", "scale"})


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    queue_s: float
    time_to_first_token_s: float
    prompt_tokens_per_s: float
    decode_tokens_per_s: float
    speculative: dict | None = None
    inter_token_p50_s: float = 0.0  # gaps between this stream's tokens
    inter_token_p95_s: float = 0.0
    shared_streams: int = 1  # the most sequences that shared a step with this one
    confidence: float | None = None  # geometric mean probability of the sampled tokens
    from_response_cache: bool = False  # replayed: no model ran
    images: int = 0  # image chunks its prompt held (an idefics3 image is its tiles)
    image_encode_s: float = 0.0  # their time in the vision tower (0 when all were kept)


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # "stop", "length" or "cancelled"
    usage: Usage


@dataclass(frozen=True)
class Failed:
    error: HomerackError


Event = Started | Delta | Finished | Failed
CANCELLED = Finished("cancelled", Usage(0, 0, 0, 0.0, 0.0, 0.0, 0.0))
LOADED = Finished("loaded", CANCELLED.usage)  # what a preload answers


@dataclass
class Job:
    id: int
    request: GenerationRequest
    emit: Callable[[Event], None]
    submitted: float = field(default_factory=time.perf_counter)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()
