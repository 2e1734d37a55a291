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
`router` (the routing pair for "auto", router.py), `embedder` (embeddings and reranking
beside the chat model, model/embeddings.py),
`tools` (the MCP servers and approvals, tools/toolbox.py), `documents` (the collections,
documents/library.py), `voice` (speech in and out) and `home` (the household's devices).
Before `submit`, a route's one call is `take` (intake.py: what was asked, resolved);
its status routes read status.py's functions of the engine.
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Callable

from .conversation.conversation import Conversation
from .conversation.images import MARKER, fetched
from .catalog.chat_format import chat_format_for
from .catalog.facts import image_tokens
from .cascade import Cascade
from .catalog.models import LocalModel, ModelStore
from .catalog.shelf import Shelf
from .errors import (HomerackError, InvalidModelFile, ModelLoadFailed, NotSupported,
                     TemplateStopped)
from .events import Asked, Event, GenerationRequest, Job, Rendered
from .fleet import Fleet
from .llama.native import fetch_cuda_runtime
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
from . import intake, status
from .intake import Taken

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
        self.gpu_runtime = fetch_cuda_runtime()  # the packaged app's, on an NVIDIA machine
        if settings.documents is not None:  # search_documents, offered as a tool
            self.tools.builtins[DOCUMENTS] = DocumentSearch(
                lambda name, query, top_k: self.documents.search(name, query, top_k),
                self.library.names)

    @property
    def _host(self):
        return self.fleet.main.host

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
        job.request = self._render(job.request)
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
                Cascade(job, self._put, self._render).start()
            else:
                self._put(job)
        except HomerackError:
            self.home.release(job)
            raise
        return job

    def _render(self, request: GenerationRequest) -> GenerationRequest:
        """The chat rendered once, with its model's format (`Rendered`, carried on the
        request from here); a template that fails fails the request here, in its own
        words (a 400 naming messages)."""
        if request.messages is None:
            return request
        request = with_system(request)
        chat_format = chat_format_for(self.store.inspector.inspect(request.model.path))
        try:
            text = chat_format.render(list(request.messages),
                                      list(request.tools) if request.tools else None,
                                      request.template_kwargs)
        except TemplateStopped as exc:
            raise TemplateStopped(f"{request.model.id}: {exc.message}", param="messages") \
                from None
        return replace(request, rendered=Rendered(text, chat_format))

    def _put(self, job: Job) -> None:
        job.request = self._tokenized(job.request)
        self.fleet.put(job)

    def _tokenized(self, request: GenerationRequest) -> GenerationRequest:
        """The prompt's tokens, here on the request's thread (the model's vocabulary
        alone): a long prompt tokenized on the model's worker stopped every stream for
        as long (24 s for 14 MiB). One longer than any context is refused having read
        its beginning only. Pictures are the projector's to tokenize, at admission."""
        if not request.generates or request.pictures or request.tokens is not None:
            return request
        try:
            limit = self._most_tokens(request.model)
            with self.vocabularies.of(request.model) as vocab:
                tokens, _ = prompt_tokens(request, vocab, limit)
        except (InvalidModelFile, ModelLoadFailed):  # no model (an adapter, a damaged
            return request  # file): its lane's load fails it, saying why
        return replace(request, tokens=tuple(tokens))

    def _most_tokens(self, model: LocalModel) -> int | None:
        """The most tokens any context of the model holds: what it was trained for, or
        the context the engine was told to give it."""
        trained = self.store.inspector.inspect(model.path).context_length or 0
        return max(trained, self.settings.load.n_ctx or 0) or None

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
        loaded = self._host.loaded
        return loaded.model if loaded else self._host.default

    def resolve(self, name: str | None) -> LocalModel:
        """The model a request names: an id of the models folder, or the default model's
        id (the command line may have named a file outside it). Never a path."""
        default = self._host.default
        if default is not None and name == default.id:
            return default
        return self.store.resolve(name)

    def take(self, asked: Asked, conversation: Conversation | None = None,
             prompt: str | list[str] | None = None) -> Taken:
        """What a request asked, with its conversation or raw prompt, as the request
        `submit` takes (intake.py): the routes' one call before submitting."""
        return intake.take(self, asked, conversation, prompt)

    def count_prompt_tokens(self, request: GenerationRequest) -> int:
        """The tokens the request's prompt will take, counted with the model's vocabulary
        alone (the model need not be loaded; the count equals its usage.prompt_tokens),
        its pictures' as its projector's header says they tile (the markers around each
        tile aside)."""
        request = self._render(request)
        if request.pictures:  # the text around them: their markers take no tokens
            request = replace(request, rendered=replace(
                request.rendered, text=request.rendered.text.replace(MARKER, "")))
        with self.vocabularies.of(request.model) as vocab:
            text = prompt_tokens(request, vocab, self._most_tokens(request.model))[0]
        return len(text) + image_tokens(request.model, request.pictures)

    def tokenize(self, model: LocalModel, text: str) -> list[int]:
        """`text` as the model's tokens (no special tokens added), the model not loaded."""
        with self.vocabularies.of(model) as vocab:
            return vocab.tokenize(text)

    # -- what the routes read: through these, never around the engine -------------------

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

        held = self.fleet.loaded()
        models = frozenset(m.id for m in self.shelf.models()
                           if self.shelf.kind_of(m) in ("chat", None))
        slots = self.fleet.main.scheduler.lanes
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

    def plan_for(self, model: LocalModel, override: LoadOverride | None = None):
        return self._host.plan_for(model, override)

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

    def abandon(self, error: HomerackError) -> None:
        """From another thread, when the loaded model can run no more (a worker holding
        its layers is gone, and llama.cpp may be blocked on it): every request running or
        waiting gets `error`. The process is restarted next (cluster mode): this is no
        crash of the load, so the load journal's watch ends (no safer plan is needed)."""
        self.fleet.main.host.end_load_watch()
        self.fleet.main.abandon(error)

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
            self.answers.close()
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
