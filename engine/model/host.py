"""The loaded model and everything that comes with it: loading by the plan (with the
crash journal and the out-of-memory back-off in loader.py), its chat format and prompt
cache, the measured memory against the plan, and the draft models that speculate for it.
Used from the engine's worker thread only."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from ..machine.calibration import Calibration
from ..catalog.chat_format import ChatFormat, chat_format_for
from ..speculation import cut_draft
from ..catalog.drafts import check_draft_fits, pick_draft
from ..errors import ContextLengthExceeded, InvalidRequest, OutOfMemory
from ..events import GenerationRequest, Usage
from ..llama.runtime import LlamaModel
from ..llama.backend import build_id
from ..catalog.fingerprint import model_fingerprint
from .adapters import AdapterBank
from .loader import LoadJournal, load
from ..catalog.models import LocalModel, ModelStore
from ..machine.planner import Plan, Preferences, auto_context, draft_bytes, place_draft, plan
from ..llama.probe import probe
from ..presets import LoadOverride, Presets
from .prompt_cache import PromptCache
from ..settings import EngineSettings
from ..speculation.controller import TIE_MARGIN, SpecController, Speculation, SpecStats
from ..speculation.drafters import LookupDrafter, ModelDrafter
from ..speculation.verify import tie_margin

MAX_DRAFTERS = 2  # draft models held per loaded model (requests may name others in turn)


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

    def close(self) -> None:
        if self.cache:
            self.cache.flush()  # states being written survive a clean shutdown
        for drafter in self.drafters.values():
            drafter.close()
        self.llama.close()

    def reset_drafters(self) -> None:
        """After a failure a draft's KV may not match its token list."""
        for drafter in self.drafters.values():
            if isinstance(drafter, ModelDrafter):
                drafter.llama.forget(0, 0)
                drafter.tokens = []

    def prompt_tokens(self, request: GenerationRequest) -> tuple[list[int], list[str]]:
        return prompt_tokens(request, self.chat_format, self.llama)

    def budget(self, request: GenerationRequest, n_prompt: int) -> tuple[int, list[str]]:
        """max_tokens, clamped to what the context holds after the prompt."""
        n_ctx = self.llama.n_ctx
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


def render_chat(request: GenerationRequest, chat_format: ChatFormat) -> str:
    """The request's messages (and tools) as prompt text, in the model's chat format."""
    tools = list(request.tools) if request.tools else None
    return chat_format.render(list(request.messages), tools, request.template_kwargs)


def prompt_tokens(request: GenerationRequest, chat_format: ChatFormat,
                  tokenizer) -> tuple[list[int], list[str]]:
    """The request's prompt as tokens (a chat rendered with the model's format), and notes
    for the answer. `tokenizer`: the loaded model, or its Vocabulary alone (counting)."""
    notes = []
    if request.messages is not None:
        text = request.rendered_prompt
        if text is None:
            text = render_chat(request, chat_format)
        if chat_format.fallback:
            notes.append(f"chat format: {chat_format.describe()}")
        tokens = tokenizer.tokenize(text, add_special=False, parse_special=True)
        if tokenizer.add_bos and (not tokens or tokens[0] != tokenizer.bos):
            tokens.insert(0, tokenizer.bos)
    else:
        tokens = tokenizer.tokenize(request.prompt or "", add_special=True, parse_special=True)
    if not tokens:
        raise InvalidRequest("the prompt is empty", param="prompt")
    return tokens, notes


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


class ModelHost:
    """Loads models by plan and holds the loaded one, its drafts and their controllers."""

    def __init__(self, store: ModelStore, settings: EngineSettings, cluster=None,
                 reserved=dict, presets: Presets | None = None,
                 calibration: Calibration | None = None):
        self.store = store
        self.reserved = reserved  # bytes per device other models hold ("CPU": RAM)
        self.settings = settings
        self.cluster = cluster  # cluster.host.Cluster when workers take part
        self.loaded: Loaded | None = None
        self._default: LocalModel | None = None  # the model of requests that name none
        self.presets = presets or Presets()  # the user's choices, by model (shared by lanes)
        self.load_error: str | None = None  # the last load's failure, for /health
        self.loading: tuple[str, float] | None = None  # (model id, fraction read) meanwhile
        self.loads = 0  # models loaded so far
        self._controllers: dict[tuple, SpecController] = {}
        self._cuts = cut_draft.DraftCuts(settings.draft_folder)
        self._whole_drafts: set[Path] = set()  # drafts whose cut missed too much text
        self._hardware = None  # probed on the first load, in the worker
        self._calibration = calibration or Calibration(settings.calibration_file)
        self._journal = LoadJournal(settings.load_journal, settings.no_repack_file)

    @property
    def default(self) -> LocalModel | None:
        """The model of requests that name none (until one is loaded)."""
        return self._default

    def make_default(self, model: LocalModel) -> None:
        self._default = model

    def override_for(self, model: LocalModel) -> LoadOverride | None:
        return self.presets.get(model.id).load

    def end_load_watch(self) -> None:
        """The loaded model stops for a reason other than a crash of its load (a worker
        went away): the next start needs no safer plan."""
        self._journal.end()

    def mark_evaluated(self) -> None:
        """A request of the loaded model ended: it survived its first evaluations, so its
        load was no crash (the journal's watch ends)."""
        if not self.loaded.evaluated:
            self.loaded.evaluated = True
            self._journal.end()

    def record_speed(self, usage: Usage) -> None:
        """The first request of a load that ran alone, after the load's first (its page
        faults and cold caches make it slow), measures the loaded plan's forecast once per
        phase: generation (16 tokens or more, without speculation) and the prompt (64 new
        tokens or more). The ratio corrects later forecasts (persisted: one file write per
        load and phase, not per request); the load's details keep the error before and
        after the correction."""
        loaded = self.loaded
        forecast = getattr(loaded.plan, "forecast", None) if loaded else None
        if forecast is None or loaded.memory is None or usage.shared_streams > 1 \
                or not loaded.evaluated:
            return
        phases = {
            "decode": (usage.decode_tokens_per_s, forecast.prior_decode_tps, forecast.decode_tps,
                       usage.completion_tokens >= 16 and not usage.speculative),
            "prompt": (usage.prompt_tokens_per_s, forecast.prior_prompt_tps, forecast.prompt_tps,
                       usage.prompt_tokens - usage.cached_tokens >= 64)}
        measured = loaded.memory.setdefault("speed", {})
        for phase, (rate, prior, planned, enough) in phases.items():
            if enough and rate > 0 and prior > 0 and phase not in measured:
                self._calibration.record_speed(f"{phase}/{forecast.key}", rate / prior)
                measured[phase] = {"measured": rate, "forecast": round(planned, 1),
                                   "error": round(planned / rate - 1, 3),
                                   "uncalibrated_forecast": round(prior, 1),
                                   "uncalibrated_error": round(prior / rate - 1, 3)}

    def is_loaded(self, model: LocalModel) -> bool:
        return (self.loaded is not None and self.loaded.model.path == model.path
                and self.loaded.override == self.override_for(model))

    def ensure_loaded(self, model: LocalModel) -> Loaded:
        if self.is_loaded(model):
            return self.loaded
        override = self.override_for(model)
        info = self.store.inspector.inspect(model.path)  # before llama.cpp ever opens it
        if info.embedding:
            raise InvalidRequest(f"{model.id} is an embedding model: it cannot generate text "
                                 "(use it with /v1/embeddings)", param="model")
        if info.adapter:
            raise InvalidRequest(f"{model.id} is a LoRA adapter, not a model: ask for its base "
                                 f"model as 'BASE+{model.id}', or name it in \"lora\"",
                                 param="model")
        self.unload()
        if self._hardware is None or self.cluster:
            self._hardware = self._probe()
        self.loading = (model.id, 0.0)
        try:
            outcome = load(model.path, info, self.settings.load_settings(), self._hardware,
                           self._preferences(info, override, model), self._journal,
                           self.cluster.place if self.cluster else plan,
                           lambda fraction: setattr(self, "loading", (model.id, fraction)))
        except Exception as exc:
            self.load_error = f"{model.id}: {getattr(exc, 'message', exc)}"
            raise
        finally:
            self.loading = None
        self.load_error = None
        self.loads += 1
        llama = outcome.llama
        fmt = chat_format_for(info)
        self.loaded = Loaded(model, llama, fmt, single_tokens(llama, fmt.turn_ends),
                             self._prompt_cache(model),
                             self._compare(outcome.plan, llama, info.architecture),
                             plan=outcome.plan, override=override, notes=outcome.notes,
                             adapters=AdapterBank(llama),
                             marker_tokens=control_tokens(llama, fmt.family.markers()))
        return self.loaded

    def held(self) -> dict[str, int]:
        """Bytes per device the loaded model was planned to take (others plan around them)."""
        plan = self.loaded.plan if self.loaded else None
        return {use.device: use.total for use in plan.uses} if plan else {}

    def unload(self) -> None:
        if self.loaded:
            self.loaded.close()
            self.loaded = None
            self._journal.end()  # unloaded before its first request: no crash either

    def close(self) -> None:
        if self.loaded:
            self.loaded.close()  # still described by status() afterwards
        self._journal.end()  # a clean stop is no crash
        self._cuts.wait(timeout=60)

    def _preferences(self, info, override: LoadOverride | None,
                     model: LocalModel) -> Preferences:
        """The planner's inputs for `model`; with draft speculation on by default, the
        draft it will pick is counted too."""
        draft = None
        if self.settings.speculation == "draft":
            picked = pick_draft(model, self.store.list(), self.store.inspector)
            draft = self.store.inspector.inspect(picked.path).shape if picked else None
        cpu_moe = self.settings.cpu_moe_layers
        if override and override.cpu_moe_layers is not None:
            cpu_moe = override.cpu_moe_layers
        chosen = dict(gpu_layers=override.gpu_layers if override else None, draft=draft,
                      calibration=self._calibration.for_architecture(info.architecture),
                      cpu_moe_layers=cpu_moe, speed_calibration=self._calibration.speeds(),
                      tensor_parallel=self.settings.tensor_parallel)
        asked = override.n_ctx if override and override.n_ctx else None
        if asked is None and self.settings.auto_ctx:
            return auto_context(**chosen)
        wanted = asked or self.settings.load.n_ctx
        n_ctx = min(wanted, info.context_length or wanted)
        return Preferences(ctx=n_ctx, min_ctx=n_ctx if asked else min(2048, n_ctx), **chosen)

    def plan_for(self, model: LocalModel, override: LoadOverride | None = None,
                 taken: dict[str, int] | None = None):
        """What loading `model` (with the user's override) would do on this machine now
        (a Plan; with workers, a cluster.placement.ClusterPlan: stages, expected speed);
        None for a model whose shape the planner cannot read. `taken`: bytes per device
        other models would hold (default: what they hold now)."""
        info = self.store.inspector.inspect(model.path)
        if info.shape is None:
            return None
        planner = self.cluster.preview if self.cluster else plan
        return planner(self._probe(taken), info.shape, self._preferences(info, override, model))

    def _probe(self, taken: dict[str, int] | None = None):
        """This machine, with the workers' devices registered first (they must be before
        llama.cpp's device list is read), less what other models hold."""
        if self.cluster:
            self.cluster.connect()
        return self._calibration.steady(probe()).within(self.settings.ram_budget).reserving(
            self.reserved() if taken is None else taken)

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
            predicted = use.total + use.mapped_gaps  # llama.cpp's buffer covers the gaps
            if use.total and got:
                kind = next((d.kind for d in self._hardware.devices if d.name == use.device),
                            "cpu")
                self._calibration.record(kind, arch, got / predicted)
                devices.append({"device": use.device, "predicted_bytes": predicted,
                                "measured_bytes": got, "ratio": round(got / predicted, 3)})
        return {"plan": planned.as_dict(), "devices": devices}

    def _prompt_cache(self, model: LocalModel) -> PromptCache | None:
        if self.settings.cache is None:
            return None
        return PromptCache(model_fingerprint(model.path), build_id(),
                           self.settings.cache_folder, self.settings.cache)

    # -- speculation ------------------------------------------------------------------

    def measure_tie_margin(self, scratch_seq: int) -> float:
        """The loaded model's tie margin (speculative.tie_margin), measured once in a
        sequence no request uses."""
        loaded = self.loaded
        if loaded.tie_margin is None:
            loaded.tie_margin = tie_margin(loaded.llama, [], scratch_seq)
        return loaded.tie_margin

    def speculation(self, request: GenerationRequest, notes: list[str],
                    scratch_seq: int, busy: set[int] = frozenset()) -> Speculation | None:
        """The request's speculation, its drafter loaded if need be; `busy`: the ids of the
        drafters running requests use (never closed under them)."""
        loaded = self.loaded
        mode = request.speculation or self.settings.speculation
        if mode == "off":
            return None
        if mode == "draft" and request.adapters:
            names = ", ".join(use.adapter.id for use in request.adapters)
            notes.append(f"draft speculation is off: the adapter {names} changes the model's "
                         "answers and the draft has no such adapter")
            return None
        if mode == "lookup":
            key = "lookup"
            if key not in loaded.drafters:
                loaded.drafters[key] = LookupDrafter()
        else:
            key = self._ready_draft(request, notes, busy)
            if key is None:
                return None
        self._keep_recent(key, busy)
        controller = self._controllers.setdefault(
            (str(loaded.model.path), key), SpecController(min_speedup=self.settings.spec_min_speedup))
        controller.start_request()
        drafter = loaded.drafters[key]
        margin = TIE_MARGIN
        if request.sampling.temperature <= 0:  # greedy exactness needs it (verify)
            margin = self.measure_tie_margin(scratch_seq)
        return Speculation(drafter, controller, SpecStats(
            mode, model=drafter.model_id, device=drafter.device, vocab=drafter.vocab), margin)

    def _keep_recent(self, key: str, busy: set[int]) -> None:
        """`key` the most recently used drafter; the least recently used beyond
        MAX_DRAFTERS that no running request uses closed, their memory given back."""
        drafters = self.loaded.drafters
        drafters[key] = drafters.pop(key)
        spare = [k for k, d in drafters.items() if k != key and id(d) not in busy]
        for old in spare[:max(0, len(drafters) - MAX_DRAFTERS)]:
            drafters.pop(old).close()

    def _ready_draft(self, request: GenerationRequest, notes: list[str],
                     busy: set[int]) -> str | None:
        """The key of the request's draft among the loaded model's drafters, loaded (cut
        when it can be); None, said in `notes`, when there is none or no room for it."""
        loaded = self.loaded
        draft = request.draft_model or pick_draft(loaded.model, self.store.list(),
                                                  self.store.inspector)
        if draft is None:
            notes.append("no compatible draft model is installed: speculation is off")
            return None
        check_draft_fits(loaded.model, draft, self.store.inspector)
        key = str(draft.path)
        held = loaded.drafters.get(key)
        if held is not None and id(held) in busy:
            return key  # running beside another request: as it is
        if held is not None and held.outside_share() > cut_draft.MAX_OUTSIDE:
            notes.append(f"{held.outside_share():.0%} of the text was outside the cut "
                         "draft's tokens: the draft runs whole from now on")
            self._whole_drafts.add(draft.path)
            held.close()
            del loaded.drafters[key]
            held = None  # reloaded whole below
        cut = self._cut_draft(draft, held, notes)
        if held is None or cut is not None:  # (re)load, or its cut is now ready
            if held is not None:
                held.close()
                del loaded.drafters[key]
            try:
                drafter = self._load_draft(draft, cut, notes)
            except OutOfMemory as exc:
                notes.append(f"speculation is off: {exc.message}")
                return None
            loaded.drafters[key] = drafter
        return key

    def _cut_draft(self, draft: LocalModel, held: ModelDrafter | None,
                   notes: list[str]) -> cut_draft.CutDraft | None:
        """The draft's cut version when it is ready and not yet in use (speculation/cut_draft.py)."""
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

    def _load_draft(self, draft: LocalModel, cut: cut_draft.CutDraft | None,
                    notes: list[str]) -> ModelDrafter:
        """The draft, cut if it can be, on the fastest device with room for it (see
        planner.place_draft); on the CPU when that fails for memory."""
        llama, device = self._open_draft(draft, cut.model if cut else draft.path)
        if cut is None:
            return ModelDrafter(llama, draft.id, device=device)
        try:
            cut_draft.load(cut, llama)
        except cut_draft.DraftCutFailed as exc:
            llama.close()
            notes.append(f"the draft runs whole: {exc}")
            return self._load_draft(draft, None, notes)
        return ModelDrafter(llama, draft.id, device=device, head=cut.keep)

    def _open_draft(self, draft: LocalModel, path: Path) -> tuple[LlamaModel, str]:
        """The draft at the target's context, where the planner puts it; OutOfMemory
        before llama.cpp when no device has room (RAM as free now)."""
        loaded = self.loaded
        settings = replace(self.settings.load, n_ctx=loaded.llama.n_ctx, n_gpu_layers=0,
                           devices=(), tensor_split=(), repack=loaded.llama.settings.repack)
        shape = self.store.inspector.inspect(draft.path).shape
        if loaded.plan is not None and shape is not None:
            place = place_draft(loaded.plan, shape, loaded.llama.n_ctx,
                                ram_free=psutil.virtual_memory().available)
            if place is None:
                raise OutOfMemory(f"the draft {draft.id} needs "
                                  f"{draft_bytes(shape, loaded.llama.n_ctx) / 2**30:.1f} GiB "
                                  "at this context, and no device has that free")
            device, layers = place
            if layers:
                try:
                    gpu = replace(settings, n_gpu_layers=layers, devices=(device,))
                    return LlamaModel(path, gpu), device
                except OutOfMemory:
                    pass
        return LlamaModel(path, settings), "CPU"
