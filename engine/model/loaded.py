"""A loaded model and what comes with it (its chat format, the tokens that end its turn
or carry its format's markers, its prompt cache, adapters and drafters), and rendering a
request's prompt into its tokens."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..catalog.chat_format import ChatFormat
from ..catalog.models import LocalModel
from ..errors import ContextLengthExceeded, InvalidRequest
from ..events import GenerationRequest
from ..llama.runtime import LlamaModel
from ..machine.planner import Plan
from ..presets import LoadOverride
from ..speculation.drafters import ModelDrafter
from ..conversation.images import MARKER
from ..llama.vision import ImagePrompt, Projector
from .adapters import AdapterBank
from .prompt_cache import PromptCache
from .vision import ImageCache


@dataclass(frozen=True)
class LoadedVision:
    """The loaded model's vision: its projector and the images it has encoded, or why
    it has none (said to a request that brings an image)."""
    projector: Projector | None = None
    why_not: str | None = None
    images: ImageCache | None = None


@dataclass
class Prompt:
    """A request's prompt: its tokens, its images' spans by where they start (vision.py),
    and notes for the answer."""
    tokens: list[int]
    notes: list[str]
    images: dict = field(default_factory=dict)
    owner: ImagePrompt | None = None  # holds the images' chunks until the prompt is held

    def close(self) -> None:
        if self.owner is not None:
            self.owner.close()


@dataclass
class Loaded:
    model: LocalModel
    llama: LlamaModel
    chat_format: ChatFormat
    turn_end_tokens: frozenset[int]
    cache: PromptCache | None
    memory: dict | None = None  # the plan, and its prediction against llama.cpp's buffers
    plan: Plan | None = None  # what it was loaded by
    override: LoadOverride | None = None  # the user's context / GPU layers
    notes: tuple[str, ...] = ()  # what the out-of-memory back-off changed
    drafters: dict = field(default_factory=dict)  # draft model path or "lookup" -> drafter
    evaluated: bool = False  # its first request ran (the load journal's watch ends)
    tie_margin: float | None = None  # measured on its first greedy draft (speculation/verify.py)
    adapters: AdapterBank | None = None  # its LoRA adapters, loaded on first use
    marker_tokens: frozenset[int] = frozenset()  # control tokens its format's reader reads
    vision: LoadedVision = field(default_factory=LoadedVision)

    def close(self) -> None:
        if self.cache:
            self.cache.close()  # states being written survive a clean shutdown
        for drafter in self.drafters.values():
            drafter.close()
        if self.vision.projector:
            self.vision.projector.close()
        self.llama.close()

    def reset_drafters(self) -> None:
        """After a failure a draft's KV may not match its token list."""
        for drafter in self.drafters.values():
            if isinstance(drafter, ModelDrafter):
                drafter.llama.forget(0, 0)
                drafter.tokens = []

    def prompt(self, request: GenerationRequest) -> Prompt:
        """The request's prompt as tokens (tokenized on its way in: Engine.submit), its
        images through the projector."""
        if not request.pictures:
            if request.tokens is not None:
                return Prompt(list(request.tokens), format_notes(request))
            return Prompt(*prompt_tokens(request, self.llama))
        projector = self.vision.projector
        if projector is None:
            raise InvalidRequest(f"{self.model.id} cannot see images: {self.vision.why_not}",
                                 param="messages")
        texts = request.rendered.text.split(MARKER)
        if len(texts) != len(request.pictures) + 1:
            raise InvalidRequest(f"the chat template placed {len(texts) - 1} of the "
                                 f"{len(request.pictures)} images", param="messages")
        owner = projector.tokenize(texts, list(request.pictures),
                                   self.llama.bos if self.llama.add_bos else None)
        if not owner.tokens or owner.tokens[-1] < 0:
            owner.close()
            raise InvalidRequest("the prompt ends with an image: text must follow it",
                                 param="messages")
        chat_format = request.rendered.chat_format
        notes = [f"chat format: {chat_format.describe()}"] if chat_format.fallback else []
        return Prompt(owner.tokens, notes, owner.images, owner)

    def budget(self, request: GenerationRequest, n_prompt: int) -> tuple[int, list[str]]:
        """max_tokens, clamped to what the context holds after the prompt."""
        n_ctx = self.llama.n_ctx
        room = n_ctx - n_prompt
        if room <= 0:
            trained = self.llama.n_ctx_train
            more = f"load it with a larger context (homerack serve --ctx {min(trained, 1 << 17)}" \
                f", up to the {trained:,} it was trained for)" if trained > n_ctx else \
                f"choose a model made for longer contexts ({self.model.id} holds at most " \
                f"{trained:,}; coding agents send 9-16k tokens: docs/agents.md)"
            raise ContextLengthExceeded(
                f"the prompt has {n_prompt} tokens but the context holds {n_ctx}; "
                f"shorten the conversation, or {more}")
        wanted = request.max_tokens or room
        if wanted > room:
            return room, [f"max_tokens {wanted} does not fit the {n_ctx}-token context after "
                          f"the {n_prompt}-token prompt; clamped to {room}"]
        return wanted, []


# A prompt's first characters tokenized to bound it: past the context, the whole is not
# (a 14 MiB prompt was 8.2M tokens, 24 s of tokenizing and 480 MiB kept, to be refused).
# English takes about 4 characters a token: 8 leaves room for any text dense in tokens;
# one sparser than that is tokenized whole, as before.
CHARS_A_TOKEN = 8


def prompt_tokens(request: GenerationRequest, tokenizer,
                  limit: int | None = None) -> tuple[list[int], list[str]]:
    """The request's prompt as tokens (a chat as Engine.submit rendered it), and notes for
    the answer. `tokenizer`: the loaded model, or its Vocabulary alone (counting).
    `limit`: the most tokens any context of the model holds; a prompt whose beginning
    alone is longer is refused before the rest is read."""
    if request.messages is not None:
        rendered = request.rendered
        if rendered is None:  # every chat passes Engine._render on its way in
            raise RuntimeError("a chat reached the model without its rendered prompt")
        _bounded(tokenizer, rendered.text, False, limit)
        tokens = tokenizer.tokenize(rendered.text, add_special=False, parse_special=True)
        if tokenizer.add_bos and (not tokens or tokens[0] != tokenizer.bos):
            tokens.insert(0, tokenizer.bos)
    else:
        _bounded(tokenizer, request.prompt or "", True, limit)
        tokens = tokenizer.tokenize(request.prompt or "", add_special=True, parse_special=True)
    if not tokens:
        raise InvalidRequest("the prompt is empty", param="prompt")
    return tokens, format_notes(request)


def format_notes(request: GenerationRequest) -> list[str]:
    """What the answer says of the chat format (a fallback when the model has none)."""
    rendered = request.rendered
    if request.messages is not None and rendered and rendered.chat_format.fallback:
        return [f"chat format: {rendered.chat_format.describe()}"]
    return []


def _bounded(tokenizer, text: str, add_special: bool, limit: int | None) -> None:
    head = limit * CHARS_A_TOKEN + 4096 if limit else None
    if head is None or len(text) <= head:
        return
    # a cut at a word may merge differently from the whole: a few tokens of margin
    n = len(tokenizer.tokenize(text[:head], add_special=add_special, parse_special=True))
    if n > limit + 16:
        raise ContextLengthExceeded(
            f"the prompt has more than {limit:,} tokens, the most this model's context "
            f"holds (its first {head:,} of {len(text):,} characters alone are {n:,}); "
            "shorten it")


def single_tokens(llama, texts) -> frozenset[int]:
    """The tokens that are each of these texts whole (a turn's end, a format's marker)."""
    found = set()
    for text in texts:
        ids = llama.tokenize(text, add_special=False, parse_special=True)
        if len(ids) == 1:
            found.add(ids[0])
    return frozenset(found)


def control_tokens(llama, texts) -> frozenset[int]:
    """Of the markers, those the vocabulary holds as control tokens (which render as
    nothing unless asked: gpt-oss's `<|end|>`, a model's own `<|channel|>`)."""
    return frozenset(t for t in single_tokens(llama, texts) if not llama.piece(t))
