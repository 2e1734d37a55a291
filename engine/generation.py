"""The engine's generation loop: one worker thread owns the loaded model.

Requests queue FIFO in a bounded queue; the worker takes one at a time, loads the model
it names if needed, evaluates only the part of the prompt not already in the sequence's
KV memory, then samples token by token, checking for cancellation after every token.
Results go back through the job's `emit` callback as small frozen events.

The loop is written around sequences (a seq id plus the tokens its KV memory holds) so
that speculative decoding, the multi-conversation prompt cache and batching can be
added as steps of this one loop.
"""

from __future__ import annotations

import itertools
import math
import queue
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from .chat_format import ChatFormat, chat_format_for
from .calibration import Calibration
from . import draft_head
from .draft import check_pair, pick_draft
from .probe import probe
from .errors import (ContextLengthExceeded, HomerackError, InvalidRequest, OutOfMemory,
                     QueueFull)
from .llama_runtime import (LlamaModel, LoadSettings, Sampler, SamplingParams, build_id,
                            model_fingerprint)
from .models import LocalModel, ModelStore
from .loader import LoadJournal, load
from .planner import Plan, Preferences, place_draft, plan
from .prompt_cache import CacheLimits, PromptCache, common_prefix
from .speculative import (TIE_MARGIN, LookupDrafter, ModelDrafter, SpecController, Speculation,
                          SpecStats, speculative_step, tie_margin)
from .text_stream import TextStream


# -- requests and events --------------------------------------------------------

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


@dataclass(frozen=True)
class Started:
    model: str
    prompt_tokens: int
    cached_tokens: int
    max_tokens: int
    n_ctx: int
    chat_format: str | None
    notes: tuple[str, ...]


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


@dataclass(frozen=True)
class EngineSettings:
    load: LoadSettings = LoadSettings()
    max_queue: int = 16
    cache: CacheLimits | None = None  # None: no prompt cache
    cache_folder: Path | None = None  # None: RAM tier only
    speculation: str = "off"          # the default for requests that do not say
    calibration_file: Path | None = None  # measured/predicted memory ratios
    load_journal: Path | None = None      # the load in progress (see loader.py)
    no_repack_file: Path | None = None    # models whose repacked weights killed an engine
    spec_min_speedup: float = 0.95    # below this measured gain speculation turns off
    draft_folder: Path | None = None  # cut drafts (draft_head.py); None: drafts run whole


@dataclass(frozen=True)
class LoadOverride:
    """The user's choice for a model, over the planner's: None keeps the planner's."""
    n_ctx: int | None = None
    gpu_layers: int | None = None


# -- the loaded model and its sequence ------------------------------------------

@dataclass
class Sequence:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # what its KV memory holds


@dataclass
class Loaded:
    model: LocalModel
    llama: LlamaModel
    chat_format: ChatFormat
    turn_end_tokens: frozenset[int]
    sequence: Sequence
    cache: PromptCache | None
    memory: dict | None = None  # the plan, and its prediction against llama.cpp's buffers
    plan: Plan | None = None  # what it was loaded by
    override: "LoadOverride | None" = None  # the user's context / GPU layers
    notes: tuple[str, ...] = ()  # what the out-of-memory back-off changed
    drafters: dict = field(default_factory=dict)  # draft model path or "lookup" -> drafter
    evaluated: bool = False  # its first request ran (the load journal's watch ends)
    tie_margin: float | None = None  # measured on first greedy speculation (speculative.py)

    def close(self) -> None:
        if self.cache:
            self.cache.flush()  # states being written survive a clean shutdown
        for drafter in self.drafters.values():
            drafter.close()
        self.llama.close()

    def reset(self) -> None:
        """Forget all KV state: after a failure it may not match the token lists."""
        self.llama.forget(self.sequence.seq_id, 0)
        self.sequence.tokens = []
        for drafter in self.drafters.values():
            if isinstance(drafter, ModelDrafter):
                drafter.llama.forget(0, 0)
                drafter.tokens = []


class Engine:
    def __init__(self, store: ModelStore, settings: EngineSettings = EngineSettings()):
        self.store = store
        self.settings = settings
        self._queue: queue.Queue[Job | None] = queue.Queue(maxsize=settings.max_queue)
        self._ids = itertools.count(1)
        self._loaded: Loaded | None = None
        self._default: LocalModel | None = None
        self._controllers: dict[tuple, SpecController] = {}
        self._cuts = draft_head.DraftCuts(settings.draft_folder)
        self._whole_drafts: set[Path] = set()  # drafts whose cut missed too much text
        self._hardware = None  # probed on the first load, in the worker
        self._calibration = Calibration(settings.calibration_file)
        self._journal = LoadJournal(settings.load_journal, settings.no_repack_file)
        self._overrides: dict[Path, LoadOverride] = {}
        self._load_error: str | None = None  # the last load's failure, for /health
        self._busy = False
        self._mean_job_s = 2.0
        self._thread = threading.Thread(target=self._work, name="homerack-engine", daemon=True)
        self._thread.start()

    # -- called from any thread ---------------------------------------------

    def submit(self, request: GenerationRequest, emit: Callable[[Event], None]) -> Job:
        job = Job(next(self._ids), request, emit)
        try:
            self._queue.put_nowait(job)
        except queue.Full:
            wait = math.ceil(self._mean_job_s * (self._queue.qsize() + 1))
            raise QueueFull(f"the engine queue is full ({self.settings.max_queue} waiting); "
                            "retry shortly", retry_after_s=max(1, wait)) from None
        return job

    def preload(self, model: LocalModel, emit: Callable[[Event], None] = lambda _e: None) -> Job:
        """Load a model ahead of the first request (a request with nothing to generate).
        It is also the model of requests that name none."""
        self._default = model
        return self.submit(GenerationRequest(model=model), emit)

    def load(self, model: LocalModel, override: LoadOverride | None,
             emit: Callable[[Event], None] = lambda _e: None) -> Job:
        """Load `model` with the user's override (None: as planned), replacing what is
        loaded; it becomes the default model."""
        if override is None:
            self._overrides.pop(model.path, None)
        else:
            self._overrides[model.path] = override
        return self.preload(model, emit)

    def default_model(self) -> LocalModel | None:
        """The model a request without one gets: the loaded one, or the preloaded one."""
        return self._loaded.model if self._loaded else self._default

    def status(self) -> dict:
        loaded = self._loaded
        return {
            "model": loaded.model.id if loaded else None,
            "n_ctx": loaded.llama.n_ctx if loaded else None,
            "offload": _offload(loaded.llama.settings.n_gpu_layers if loaded else 0),
            "busy": self._busy,
            "memory": loaded.memory if loaded else None,
            "load_notes": list(loaded.notes) if loaded else [],
            "load_error": self._load_error,
            "prompt_cache": self.cache_status(),
            "queued": self._queue.qsize(),
            "max_queue": self.settings.max_queue,
        }

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=30)
        self._cuts.wait(timeout=60)

    # -- the worker thread ----------------------------------------------------

    def _work(self) -> None:
        while (job := self._queue.get()) is not None:
            self._busy = True
            started = time.perf_counter()
            try:
                self._run(job)
            except Exception as exc:  # a bug or a failed decode must not kill the worker
                if self._loaded:
                    self._loaded.reset()
                error = exc if isinstance(exc, HomerackError) else \
                    HomerackError(f"internal error: {exc!r}")
                job.emit(Failed(error))
            finally:
                self._busy = False
                self._mean_job_s = 0.8 * self._mean_job_s + 0.2 * (time.perf_counter() - started)
        if self._loaded:
            self._loaded.close()
        self._journal.end()  # a clean stop is no crash

    def _run(self, job: Job) -> None:
        if job.cancelled.is_set():
            job.emit(CANCELLED)
            return
        queue_s = time.perf_counter() - job.submitted
        loaded = self._ensure_loaded(job.request.model)
        if job.request.messages is None and job.request.prompt is None:
            job.emit(LOADED)  # a preload
            return
        prompt, notes = self._prompt_tokens(loaded, job.request)
        max_tokens, clamp_note = self._budget(loaded, job.request, len(prompt))
        notes += clamp_note
        spec = self._speculation(loaded, job.request, notes)
        t0 = time.perf_counter()
        cached = self._prefill(loaded, prompt, job)
        if cached is None:
            job.emit(CANCELLED)
            return
        job.emit(Started(loaded.model.id, len(prompt), cached, max_tokens, loaded.llama.n_ctx,
                         loaded.chat_format.describe() if job.request.messages else None,
                         tuple(notes)))
        self._generate(loaded, job, max_tokens, t0, queue_s, len(prompt), cached, spec)
        if not loaded.evaluated:  # it survived its first evaluations
            loaded.evaluated = True
            self._journal.end()
        if loaded.cache and job.request.cache_prompt:
            loaded.cache.save(loaded.sequence.tokens,
                              loaded.llama.snapshot(loaded.sequence.seq_id))

    def _ensure_loaded(self, model: LocalModel) -> Loaded:
        override = self._overrides.get(model.path)
        if self._loaded and self._loaded.model.path == model.path \
                and self._loaded.override == override:
            return self._loaded
        info = self.store.inspector.inspect(model.path)  # before llama.cpp ever opens it
        if self._loaded:
            self._loaded.close()
            self._loaded = None
        if self._hardware is None:
            self._hardware = probe()
        try:
            outcome = load(model.path, info, self.settings.load, self._hardware,
                           self._preferences(info, override, model), self._journal)
        except HomerackError as exc:
            self._load_error = f"{model.id}: {exc.message}"
            raise
        self._load_error = None
        llama = outcome.llama
        fmt = chat_format_for(info)
        turn_ends = set()
        for text in fmt.turn_ends:
            ids = llama.tokenize(text, add_special=False, parse_special=True)
            if len(ids) == 1:
                turn_ends.add(ids[0])
        self._loaded = Loaded(model, llama, fmt, frozenset(turn_ends), Sequence(0),
                              self._prompt_cache(model),
                              self._compare(outcome.plan, llama, info.architecture),
                              plan=outcome.plan,
                              override=override, notes=outcome.notes)
        return self._loaded

    def _preferences(self, info, override: "LoadOverride | None",
                     model: LocalModel) -> Preferences:
        """The planner's inputs for `model`; with draft speculation on by default, the
        draft it will pick is counted too."""
        draft = None
        if self.settings.speculation == "draft":
            picked = pick_draft(model, self.store.list(), self.store.inspector)
            draft = self.store.inspector.inspect(picked.path).shape if picked else None
        wanted = self.settings.load.n_ctx
        n_ctx = min(override.n_ctx if override and override.n_ctx else wanted,
                    info.context_length or wanted)
        return Preferences(
            ctx=n_ctx, min_ctx=n_ctx if override and override.n_ctx else min(2048, n_ctx),
            gpu_layers=override.gpu_layers if override else None, draft=draft,
            calibration=self._calibration.for_architecture(info.architecture))

    def plan_for(self, model: LocalModel, override: "LoadOverride | None" = None) -> Plan | None:
        """What loading `model` (with the user's override) would do on this machine now;
        None for a model whose shape the planner cannot read."""
        info = self.store.inspector.inspect(model.path)
        if info.shape is None:
            return None
        return plan(probe(), info.shape, self._preferences(info, override, model))

    def _compare(self, planned, llama: LlamaModel, arch: str) -> dict | None:
        """Measured against predicted bytes per device; the ratios calibrate later plans."""
        if planned is None:
            return None
        measured: dict[str, int] = {}
        for (device, _kind), size in llama.buffers.items():
            measured[device] = measured.get(device, 0) + size
        devices = []
        for use in planned.uses:
            got = measured.get(use.device, 0)
            if use.total and got:
                kind = next((d.kind for d in self._hardware.devices if d.name == use.device),
                            "cpu")
                self._calibration.record(kind, arch, got / use.total)
                devices.append({"device": use.device, "predicted_bytes": use.total,
                                "measured_bytes": got, "ratio": round(got / use.total, 3)})
        return {"plan": planned.as_dict(), "devices": devices}

    def _prompt_cache(self, model: LocalModel) -> PromptCache | None:
        if self.settings.cache is None:
            return None
        return PromptCache(model_fingerprint(model.path), build_id(),
                           self.settings.cache_folder, self.settings.cache)

    def _prompt_tokens(self, loaded: Loaded, request: GenerationRequest) -> tuple[list[int], list[str]]:
        llama, notes = loaded.llama, []
        if request.messages is not None:
            text = loaded.chat_format.render(list(request.messages))
            if loaded.chat_format.fallback:
                notes.append(f"chat format: {loaded.chat_format.describe()}")
            tokens = llama.tokenize(text, add_special=False, parse_special=True)
            if llama.add_bos and (not tokens or tokens[0] != llama.bos):
                tokens.insert(0, llama.bos)
        else:
            tokens = llama.tokenize(request.prompt or "", add_special=True, parse_special=True)
        if not tokens:
            raise InvalidRequest("the prompt is empty", param="prompt")
        return tokens, notes

    def _budget(self, loaded: Loaded, request: GenerationRequest, n_prompt: int) -> tuple[int, list[str]]:
        n_ctx = loaded.llama.n_ctx
        room = n_ctx - n_prompt
        if room <= 0:
            raise ContextLengthExceeded(
                f"the prompt has {n_prompt} tokens but the context holds {n_ctx}; "
                "shorten the conversation")
        wanted = request.max_tokens or room
        if wanted > room:
            return room, [f"max_tokens {wanted} does not fit the {n_ctx}-token context after "
                          f"the {n_prompt}-token prompt; clamped to {room}"]
        return wanted, []

    def _prefill(self, loaded: Loaded, prompt: list[int], job: Job) -> int | None:
        """Evaluate what the sequence's KV memory lacks; return how many were reused.
        The longest prefix comes from the live sequence or from the prompt cache.
        None when the job was cancelled meanwhile."""
        seq, llama = loaded.sequence, loaded.llama
        if not job.request.cache_prompt:
            llama.forget(seq.seq_id, 0)
            seq.tokens = []
        hit = loaded.cache.best(prompt) if loaded.cache and job.request.cache_prompt else None
        if hit and hit.length > common_prefix(seq.tokens, prompt):
            state = loaded.cache.fetch(hit)
            restored = state is not None and llama.restore(seq.seq_id, state)
            seq.tokens = list(hit.entry.tokens) if restored else []
        keep = llama.sync(seq.tokens, prompt, seq.seq_id, stop=job.cancelled.is_set)
        return keep if len(seq.tokens) == len(prompt) else None

    def _speculation(self, loaded: Loaded, request: GenerationRequest,
                     notes: list[str]) -> Speculation | None:
        mode = request.speculation or self.settings.speculation
        if mode == "off":
            return None
        if mode == "lookup":
            key = "lookup"
            if key not in loaded.drafters:
                loaded.drafters[key] = LookupDrafter()
        else:
            draft = request.draft_model or pick_draft(loaded.model, self.store.list(),
                                                      self.store.inspector)
            if draft is None:
                notes.append("no compatible draft model is installed: speculation is off")
                return None
            check_pair(loaded.model, draft, self.store.inspector)
            key = str(draft.path)
            held = loaded.drafters.get(key)
            if held is not None and held.outside_share() > draft_head.MAX_OUTSIDE:
                notes.append(f"{held.outside_share():.0%} of the text was outside the cut "
                             "draft's tokens: the draft runs whole from now on")
                self._whole_drafts.add(draft.path)
                held.close()
                held = None  # reloaded whole below
            cut = self._cut_draft(draft, held, notes)
            if held is None or cut is not None:  # (re)load, or its cut is now ready
                if held is not None:
                    held.close()
                loaded.drafters[key] = self._load_draft(loaded, draft, cut, notes)
        controller = self._controllers.setdefault(
            (str(loaded.model.path), key), SpecController(min_speedup=self.settings.spec_min_speedup))
        controller.start_request()
        drafter = loaded.drafters[key]
        margin = TIE_MARGIN
        if request.sampling.temperature <= 0:  # greedy exactness needs it (verify)
            if loaded.tie_margin is None:
                loaded.tie_margin = tie_margin(loaded.llama, loaded.sequence.tokens,
                                               loaded.sequence.seq_id)
            margin = loaded.tie_margin
        return Speculation(drafter, controller, SpecStats(
            mode, model=drafter.model_id, device=drafter.device, vocab=drafter.vocab), margin)

    def _cut_draft(self, draft: LocalModel, held: ModelDrafter | None,
                   notes: list[str]) -> draft_head.CutDraft | None:
        """The draft's cut version when it is ready and not yet in use (see draft_head)."""
        if held is not None and held.head is not None:
            return None
        if draft.path in self._whole_drafts:
            return None
        cut = self._cuts.ready(draft.path, self.store.inspector.inspect(draft.path).vocab_size)
        if held is None and self._cuts.building(draft.path):
            notes.append("the draft runs whole while a faster cut of it is made "
                         "(once, about 20 s, in the background)")
        failure = self._cuts.failure(draft.path)
        if failure and held is None:
            notes.append(failure)
        return cut

    def _load_draft(self, loaded: Loaded, draft: LocalModel, cut: draft_head.CutDraft | None,
                    notes: list[str]) -> ModelDrafter:
        """The draft, cut if it can be, on the fastest device with room for it (see
        planner.place_draft); on the CPU when that fails for memory."""
        llama, device = self._open_draft(loaded, draft, cut.model if cut else draft.path)
        if cut is None:
            return ModelDrafter(llama, draft.id, device=device)
        try:
            draft_head.load(cut, llama)
        except draft_head.DraftCutFailed as exc:
            llama.close()
            notes.append(f"the draft runs whole: {exc}")
            return self._load_draft(loaded, draft, None, notes)
        return ModelDrafter(llama, draft.id, device=device, head=cut.keep)

    def _open_draft(self, loaded: Loaded, draft: LocalModel, path: Path) -> tuple[LlamaModel, str]:
        settings = replace(self.settings.load, n_ctx=loaded.llama.n_ctx, n_gpu_layers=0,
                           devices=(), tensor_split=(), repack=loaded.llama.settings.repack)
        shape = self.store.inspector.inspect(draft.path).shape
        if loaded.plan is not None and shape is not None:
            device, layers = place_draft(loaded.plan, shape, loaded.llama.n_ctx)
            if layers:
                try:
                    gpu = replace(settings, n_gpu_layers=layers, devices=(device,))
                    return LlamaModel(path, gpu), device
                except OutOfMemory:
                    pass
        return LlamaModel(path, settings), "CPU"

    def _generate(self, loaded: Loaded, job: Job, max_tokens: int, t0: float,
                  queue_s: float, n_prompt: int, cached: int, spec: Speculation | None) -> None:
        llama, seq = loaded.llama, loaded.sequence
        out = Output(job, loaded, max_tokens)
        sampler = Sampler(job.request.sampling, llama.n_vocab)
        t_first = None
        try:
            last = sampler.sample(llama)
            t_first = time.perf_counter()
            going = out.take(last)
            if going and spec:
                spec.drafter.follow([*seq.tokens, last])
            while going:
                room = min(max_tokens - out.produced, llama.n_ctx - len(seq.tokens))
                tokens = self._step(loaded, last, sampler, spec, room)
                going = all(out.take(token) for token in tokens)
                last = tokens[-1]
        finally:
            sampler.close()
        usage = self._usage(t0, t_first, queue_s, n_prompt, cached, out.produced)
        if spec:
            usage = replace(usage, speculative={**spec.stats.as_dict(spec.controller),
                                                "tie_margin": round(spec.tie_margin, 3),
                                                "note": spec.controller.note})
            spec.controller.note = None
        out.finish(usage)

    @staticmethod
    def _step(loaded: Loaded, last: int, sampler: Sampler, spec: Speculation | None,
              room: int) -> list[int]:
        """Evaluate `last` and pick what follows: one token, or a speculative round."""
        llama, seq = loaded.llama, loaded.sequence
        if spec is not None and not spec.controller.wants_plain() and room >= 2:
            tokens = speculative_step(llama, seq.tokens, last, spec, sampler, seq.seq_id, room)
            if tokens:
                return tokens
        started = time.perf_counter()
        llama.decode([last], len(seq.tokens), seq.seq_id)
        seq.tokens.append(last)
        token = sampler.sample(llama)
        if spec and spec.controller.wants_plain():
            spec.controller.record_plain(time.perf_counter() - started)
        return [token]

    def cache_status(self) -> dict | None:
        loaded = self._loaded
        if not loaded or not loaded.cache:
            return None
        cache = loaded.cache
        return {"entries": len(cache.entries()), "ram_bytes": cache.ram_bytes(),
                "disk_bytes": cache.disk_bytes(), **cache.stats}

    @staticmethod
    def _usage(t0, t_first, queue_s, n_prompt, cached, produced) -> Usage:
        now = time.perf_counter()
        t_first = t_first or now
        prompt_s = max(t_first - t0, 1e-9)
        decode_s = now - t_first
        return Usage(
            prompt_tokens=n_prompt,
            completion_tokens=produced,
            cached_tokens=cached,
            queue_s=round(queue_s, 4),
            time_to_first_token_s=round(prompt_s, 4),
            prompt_tokens_per_s=round((n_prompt - cached) / prompt_s, 2),
            decode_tokens_per_s=round((produced - 1) / decode_s, 2) if produced > 1 and decode_s > 0 else 0.0,
        )


def _offload(n_gpu_layers: int) -> str:
    return f"{n_gpu_layers} layers on GPU" if n_gpu_layers else "CPU"


class Output:
    """Emits one request's tokens as text and decides when generation stops."""

    def __init__(self, job: Job, loaded: Loaded, max_tokens: int):
        self.job, self.loaded, self.max_tokens = job, loaded, max_tokens
        self.stream = TextStream(job.request.stop + loaded.chat_format.turn_ends)
        self.produced = 0
        self.reason = "length"

    def take(self, token: int) -> bool:
        """Emit a token; False when generation must stop."""
        if self.job.cancelled.is_set():
            self.reason = "cancelled"
            return False
        self.produced += 1
        llama = self.loaded.llama
        if not self.job.request.ignore_eos and (llama.is_end_of_generation(token)
                                                or token in self.loaded.turn_end_tokens):
            self.reason = "stop"
            return False
        text = self.stream.feed(llama.piece(token))
        if text:
            self.job.emit(Delta(text))
        if self.stream.stopped:
            self.reason = "stop"
            return False
        return self.produced < self.max_tokens

    def finish(self, usage: Usage) -> None:
        tail = self.stream.flush()
        if tail:
            self.job.emit(Delta(tail))
        self.job.emit(Finished(self.reason, usage))
