"""The engine the API calls. Requests go to a lane (batching/lane.py: a loaded model, its
queue and the worker thread that batches its requests); the fleet (fleet.py) holds a lane
per loaded model, loads the models requests name on demand and unloads idle ones.

`submit` takes a request through its steps before a lane: the model id "auto" resolved
to the small or the large model of the routing pair (router.py), the chat rendered, an identical
deterministic request's answer replayed from the response cache (response_cache.py) or
the new one recorded there, and a cascade (cascade.py) run when routing asks for one.

`Engine` is the facade for generation and the models' lifecycle. Besides its methods, the
routes use these services directly, each the one object that holds its state: `shelf`
(the models on disk, catalog/shelf.py), `presets` (the user's choices per model),
`router` (the routing pair for "auto", router.py),
`tools` (the MCP servers and approvals, tools/toolbox.py), `documents` (the collections,
documents/library.py), `voice` (speech in and out) and `home` (the household's devices).
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from .conversation.compose import Composed
from .conversation.images import MARKER, fetched
from .catalog.chat_format import ChatFormat, chat_format_for
from .catalog.drafts import check_draft_fits, check_size
from .catalog.facts import image_tokens
from .catalog.sampling_defaults import model_defaults
from .cascade import Cascade
from .catalog.models import LocalModel, ModelStore
from .catalog.shelf import Shelf
from .errors import HomerackError, NotSupported, TemplateStopped
from .events import Event, GenerationRequest, Job, Rendered, SamplingParams
from .fleet import Fleet
from .llama.grammar import composed_grammar
from .llama.probe import probe
from .machine.planner import Preferences
from .model.embeddings import Embedder
from .model.vocabularies import Vocabularies
from .model.loaded import prompt_tokens
from .settings import EngineSettings
from .presets import Keep, LoadOverride, Presets
from .catalog.fingerprint import Fingerprints
from .response_cache import Recording, ResponseCache, deterministic, replay, request_key
from .router import Router
from .tools.builtin import DOCUMENTS, DocumentSearch
from .tools.toolbox import Toolbox
from .documents.collections import Collections
from .documents.library import Library
from .home.household import Household
from .voice.voice import Voice
from . import status

if TYPE_CHECKING:  # imported where used: the engine starts without the Hub or replicas
    from .cluster.replicas import MachineLoad

log = logging.getLogger("homerack.engine")



class Engine:
    def __init__(self, store: ModelStore, settings: EngineSettings = EngineSettings(),
                 cluster=None, replicas=None):
        self.store = store
        self.settings = settings
        self.replicas = replicas  # cluster.replicas.Replicas: machines serving whole models
        self.embedder = Embedder(store, settings.load)
        self.presets = Presets(settings.presets_file)
        self.fleet = Fleet(store, settings, cluster, self.presets,
                           lambda: {"CPU": self.embedder.bytes + self._voice_bytes()})
        self.answers = (ResponseCache(settings.response_cache, settings.response_cache_bytes)
                        if settings.response_cache else None)
        self._fingerprints = Fingerprints()
        self._ids = itertools.count(1)
        self.vocabularies = Vocabularies(store)  # tokenizers for counting, unloaded models
        self._voice_lock = threading.Lock()
        self.router = Router(store, self.fleet, self.submit)  # the pair "auto" chooses from
        self.shelf = Shelf(store)  # what the routes read about the models on disk
        self.tools = Toolbox(settings.mcp_config, settings.tool_approvals, settings.tool_logs,
                             settings.request_mcp)  # MCP servers and the user's approvals
        self.library = Library(settings.documents, self, store)  # the user's documents
        self.home = Household(settings.home)  # the paired devices, their use and limits
        self._voice: Voice | None = None
        if settings.documents is not None:  # search_documents, offered as a tool
            self.tools.builtins[DOCUMENTS] = DocumentSearch(
                lambda name, query, top_k: self.documents.search(name, query, top_k),
                self.library.names)

    @property
    def main(self):
        return self.fleet.main

    @property
    def host(self):
        return self.fleet.main.host

    @property
    def scheduler(self):
        return self.main.scheduler

    # -- called from any thread ---------------------------------------------

    def submit(self, request: GenerationRequest, emit: Callable[[Event], None]) -> Job:
        """Queue a request; its events go to `emit`. On the way to a lane: a routed
        request ("auto") gets its model, its chat is rendered (once: the cache key and
        the admission share it), a cached answer is replayed at once from this thread,
        a new one is recorded, and a cascade starts with its small model."""
        if any(p.url for p in request.pictures):  # on this worker thread, not the loop
            request = replace(request, pictures=fetched(request.pictures,
                                                        self.settings.image_urls,
                                                        self.settings.image_hosts))
        job = Job(next(self._ids), request, emit)
        route = self.router.route(job)
        job.request = self.render(job.request)
        self.home.take(job)  # a device's share and limits (429), the owner's precedence
        try:
            key = self._cache_key(job.request)  # a device's keyed apart (response_cache.py)
            if key and job.request.response_cache == "use":
                answer = self.answers.get(*key, job.request.model.path)
                if answer:
                    replay(job, answer, route)
                    return job
            job.emit = Recording(job, self.answers, key, route)
            if job.request.escalate_to:
                Cascade(job, self._put, self.render).start()
            else:
                self._put(job)
        except HomerackError:
            self.home.release(job)
            raise
        return job

    def render(self, request: GenerationRequest) -> GenerationRequest:
        """The chat rendered once, with its model's format (`Rendered`, carried on the
        request from here); a template that fails fails the request here, in its own
        words (a 400 naming messages)."""
        if request.messages is None:
            return request
        request = with_system(request)
        chat_format = self.chat_format_of(request.model)
        try:
            text = chat_format.render(list(request.messages),
                                      list(request.tools) if request.tools else None,
                                      request.template_kwargs)
        except TemplateStopped as exc:
            raise TemplateStopped(f"{request.model.id}: {exc.message}", param="messages") \
                from None
        return replace(request, rendered=Rendered(text, chat_format))

    def _put(self, job: Job) -> None:
        self.fleet.put(job)

    def preload(self, model: LocalModel, emit: Callable[[Event], None] = lambda _e: None,
                default: bool = True) -> Job:
        """Load a model ahead of the first request (a request with nothing to generate).
        As `default`, it is the model of requests that name none and replaces the main
        lane's; otherwise it loads beside the others, as a request naming it would."""
        if default:
            self.fleet.promote(model)
        return self.submit(GenerationRequest(model=model), emit)

    def load(self, model: LocalModel, override: LoadOverride | None,
             emit: Callable[[Event], None] = lambda _e: None, default: bool = True,
             keep: Keep | None = None) -> Job:
        """Load `model` with the user's override (None: as planned) and how long it
        stays (None: the engine's default), kept as its preset (see preload)."""
        self.presets.set(model.id, load=override, **({} if keep is None else {"keep": keep}))
        return self.preload(model, emit, default)

    def unload(self, model_id: str) -> bool:
        """Unload a model now (its requests end with an error); False when not loaded."""
        return self.fleet.unload(model_id, "unloaded by hand")

    def default_model(self) -> LocalModel | None:
        """The model a request without one gets: the loaded one, or the preloaded one."""
        loaded = self.host.loaded
        return loaded.model if loaded else self.host.default

    def resolve(self, name: str | None) -> LocalModel:
        """The model a request names: an id of the models folder, or the default model's
        id (the command line may have named a file outside it). Never a path."""
        default = self.host.default
        if default is not None and name == default.id:
            return default
        return self.store.resolve(name)

    def chat_format_of(self, model: LocalModel) -> ChatFormat:
        """The chat format a model's prompts are rendered in (its template, or the
        fallback), read from its file's metadata without loading it."""
        return chat_format_for(self.store.inspector.inspect(model.path))

    def encoded_pictures(self, model: LocalModel):
        """Whether the model, as loaded now, has encoded a picture (by its file's hash):
        the picture caps leave those out (a conversation resends its history)."""
        lane = self.fleet.holding(model)
        loaded = lane.host.loaded if lane is not None else None
        if loaded is None or loaded.model.path != model.path:  # (not loaded yet)
            return lambda _digest: False
        cache = loaded.vision.images
        return cache.knows if cache is not None else (lambda _digest: False)

    def sampling_defaults(self, model: LocalModel) -> SamplingParams:
        """What a request for `model` that leaves sampling out is sampled with."""
        chosen = model_defaults(self.store.inspector.inspect(model.path), model.params)
        return SamplingParams(chosen.temperature, chosen.top_p, chosen.top_k, chosen.min_p,
                              frequency_penalty=chosen.frequency_penalty)

    def embed(self, model: LocalModel, inputs: list) -> tuple:
        """Vectors from an embedding model, loaded next to the chat model (model/embeddings.py);
        runs on the caller's thread."""
        return self.embedder.embed(model, inputs)

    def rank(self, model: LocalModel, query: str, passages: list[str]):
        """A reranker's score of each passage for `query` (model/embeddings.py)."""
        return self.embedder.rank(model, query, passages)

    def count_prompt_tokens(self, request: GenerationRequest) -> int:
        """The tokens the request's prompt will take, counted with the model's vocabulary
        alone (the model need not be loaded; the count equals its usage.prompt_tokens),
        its pictures' as its projector's header says they tile (the markers around each
        tile aside)."""
        request = self.render(request)
        if request.pictures:  # the text around them: their markers take no tokens
            request = replace(request, rendered=replace(
                request.rendered, text=request.rendered.text.replace(MARKER, "")))
        with self.vocabularies.of(request.model) as vocab:
            text = prompt_tokens(request, vocab)[0]
        return len(text) + image_tokens(request.model, request.pictures)

    def tokenize(self, model: LocalModel, text: str) -> list[int]:
        """`text` as the model's tokens (no special tokens added), the model not loaded."""
        with self.vocabularies.of(model) as vocab:
            return vocab.tokenize(text)

    # -- what the routes read: through these, never around the engine -------------------

    def check_draft(self, model: LocalModel, draft: LocalModel) -> None:
        """Raise InvalidRequest unless `draft` can speculate for `model`."""
        check_draft_fits(model, draft, self.store.inspector)  # the tokenizer's word first
        check_size(model, draft)

    def adapter_uses(self, model: LocalModel, chosen: list[tuple[str, float]]) -> tuple:
        return self.store.adapter_uses(model, chosen)

    def loaded(self) -> list[dict]:
        """The chat models held: where, how much, idle since, time to live."""
        return self.fleet.loaded()

    def ask(self, model: LocalModel, n_ctx: int | None = None, keep: Keep | None = None) -> None:
        """What a request asks for `model` (Ollama's num_ctx, keep_alive): its context
        (a different one reloads it) and how long it stays loaded once idle; until
        another asks otherwise, and the user's preset still wins (presets.py)."""
        if n_ctx is not None:
            self.presets.ask(model.id, load=LoadOverride(n_ctx=n_ctx))
        if keep is not None:
            self.presets.ask(model.id, keep=keep)

    def machine_load(self, here: str) -> MachineLoad:
        """This machine as the replicas' chooser sees it: the chat models it has and
        holds, how busy they are, how fast each decodes (cluster/replicas.py)."""
        from .cluster.replicas import MachineLoad

        held = self.loaded()
        models = frozenset(m.id for m in self.shelf.models()
                           if self.shelf.kind_of(m) in ("chat", None))
        slots = self.scheduler.lanes
        return MachineLoad(here, models, frozenset(m["id"] for m in held),
                           sum(m["running"] + m["queued"] for m in held) / slots,
                           {m["id"]: m["decode_tokens_per_s"] for m in held
                            if m.get("decode_tokens_per_s")}, local=True, slots=slots)

    def hardware(self) -> dict:
        """This machine as llama.cpp sees it, steadied by measured loads, and what it can
        run (machine/capacity.py). Probes: call off the event loop."""
        from .machine.capacity import capacity

        found = self.fleet.calibration.steady(probe())
        measured = Preferences(speed_calibration=self.fleet.calibration.speeds())
        return {**found.as_dict(), "capacity": capacity(found, measured).as_dict()}

    def judge_repo(self, repo: str, ctx: int, token: str | None):
        """A Hub repository's quants judged for this machine (hub/repos.py)."""
        from .hub.repos import repo_verdicts

        return repo_verdicts(repo, probe(), Preferences(ctx=ctx), token=token,
                             fitting=self.store.fitting)

    def grammar(self, composed: Composed, param: str = "tools") -> str | None:
        """The grammar a composed turn's output must follow (None: it is free)."""
        return composed_grammar(composed, param)

    def plan_for(self, model: LocalModel, override: LoadOverride | None = None):
        return self.host.plan_for(model, override)

    # -- the response cache -------------------------------------------------------------

    def _cache_key(self, request: GenerationRequest) -> tuple[str, str] | None:
        """The request's key in the response cache and its model's fingerprint; None when
        it may not be answered from it or stored (not deterministic, opted out, no cache,
        nothing to generate, a chat that did not render)."""
        if (self.answers is None or not request.generates or request.response_cache == "off"
                or not deterministic(request)):
            return None
        prompt = (request.prompt or "") if request.messages is None else request.rendered.text
        try:
            escalate = request.escalate_to and self._fingerprints.of(request.escalate_to.path)
            override = self.presets.get(request.model.id).load
            n_ctx = override.n_ctx if override and override.n_ctx else self.settings.load.n_ctx
            fingerprint = self._fingerprints.of(request.model.path)
            adapters = tuple((self._fingerprints.of(use.adapter.path), use.scale)
                             for use in request.adapters)
            projector = self._fingerprints.of(request.model.projector) \
                if request.pictures and request.model.projector else None
            return request_key(request, prompt, fingerprint, n_ctx, escalate,
                               adapters, projector), fingerprint
        except OSError as exc:  # the worker reports a missing or unreadable file properly
            log.debug("response cache: no key (%s)", exc)
            return None

    # -- figures ------------------------------------------------------------------------

    def status(self) -> dict:
        """What the engine holds and does (GET /health): status.py puts it together."""
        return status.engine_status(self)

    def home_status(self) -> dict:
        """Sharing with the home, its devices and who waits (GET /v1/home): /health's
        `home` without the rest of the engine's status."""
        return status.home_status(self, self.fleet.loaded())

    def cluster_status(self) -> dict | None:
        return status.cluster_status(self.host.cluster, self.main)

    def cache_status(self) -> dict | None:
        return status.cache_status(self.host.loaded)

    def abandon(self, error: HomerackError) -> None:
        """From another thread, when the loaded model can run no more (a worker holding
        its layers is gone, and llama.cpp may be blocked on it): every request running or
        waiting gets `error`. The process is restarted next (cluster mode): this is no
        crash of the load, so the load journal's watch ends (no safer plan is needed)."""
        self.main.host.end_load_watch()
        self.main.abandon(error)

    def _voice_bytes(self) -> int:
        return self._voice.bytes if self._voice is not None else 0

    @property
    def voice(self) -> Voice:
        """Speech in and out (made on first use: the recogniser loads when first asked)."""
        if self.settings.voice is None:
            raise NotSupported("this engine keeps no speech models")
        with self._voice_lock:
            if self._voice is None:
                self._voice = Voice(self.settings.voice, self.settings.load.n_threads)
        return self._voice

    @property
    def documents(self) -> Collections:
        """The user's document collections, a service the routes use directly (opened on
        first use: documents/library.py)."""
        return self.library.collections

    def close(self) -> None:
        self.shelf.close()
        self.tools.close()
        self.library.close()
        if self.replicas:
            self.replicas.close()
        self.fleet.close()
        if self.answers:
            self.answers.flush()
        self.embedder.close()
        self.vocabularies.close()


def with_system(request: GenerationRequest) -> GenerationRequest:
    """A chat with the system prompt its model's app keeps for it (Ollama's system
    layer) first, when the chat has none of its own."""
    system = request.model.system
    if not system or any(m.get("role") == "system" for m in request.messages):
        return request
    return replace(request, messages=({"role": "system", "content": system},
                                      *request.messages))
