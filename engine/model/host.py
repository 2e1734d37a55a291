"""The model host: loading by the plan (with the crash journal and the out-of-memory
back-off in loader.py), the loaded model with its chat format and prompt cache
(loaded.py), the measured memory against the plan; the draft models that speculate for
it are drafts.py's. Used from the engine's worker thread only."""

from __future__ import annotations

from pathlib import Path

from ..machine.calibration import Calibration
from ..catalog.chat_format import chat_format_for
from ..catalog.drafts import pick_draft
from ..errors import InvalidRequest, ModelLoadFailed
from ..events import GenerationRequest, Usage
from ..llama.runtime import LlamaModel
from ..llama.backend import build_id
from ..catalog.fingerprint import model_fingerprint
from .drafts import Drafts
from .adapters import AdapterBank
from .loaded import Loaded, LoadedVision, control_tokens, single_tokens
from .vision import ImageCache, load_projector, wanted_projector
from .loader import LoadJournal, load
from ..catalog.models import LocalModel, ModelStore
from ..machine.memory import where_projector
from ..machine.planner import Preferences, auto_context, plan
from ..llama.probe import probe
from ..presets import LoadOverride, Presets
from .prompt_cache import PromptCache
from ..settings import EngineSettings
from ..speculation.controller import Speculation


class ModelHost:
    """Loads models by plan and holds the loaded one; its drafts are drafts.py's."""

    def __init__(self, store: ModelStore, settings: EngineSettings, cluster=None,
                 reserved=dict, presets: Presets | None = None,
                 calibration: Calibration | None = None):
        self.store = store
        self.reserved = reserved  # bytes per device other models hold ("CPU": RAM)
        self.settings = settings
        self.cluster = cluster  # cluster.head.Cluster when workers take part
        self.loaded: Loaded | None = None
        self._default: LocalModel | None = None  # the model of requests that name none
        self.presets = presets or Presets()  # the user's choices, by model (shared by lanes)
        self.load_error: str | None = None  # the last load's failure, for /health
        self.loading: tuple[str, float] | None = None  # (model id, fraction read) meanwhile
        self.loads = 0  # models loaded so far
        self.drafts = Drafts(store, settings)  # the loaded model's drafters and controllers
        self._hardware = None  # probed on the first load, in the worker
        self._calibration = calibration or Calibration(settings.calibration_file)
        self._journal = LoadJournal(settings.load_journal, settings.no_repack_file)

    @property
    def hardware(self):
        """The machine as the last load probed it (None before the first)."""
        return self._hardware

    @property
    def default(self) -> LocalModel | None:
        """The model of requests that name none (until one is loaded)."""
        return self._default

    def make_default(self, model: LocalModel) -> None:
        self._default = model

    def override_for(self, model: LocalModel) -> LoadOverride | None:
        """The user's choices for `model`; else what a request asked (Ollama's num_ctx);
        else the context its app keeps for it (Ollama's num_ctx parameter). A change
        reloads the model at its next request."""
        chosen = self.presets.get(model.id).load or self.presets.asked(model.id).load
        n_ctx = model.param("num_ctx")
        if chosen is None and isinstance(n_ctx, int) and n_ctx >= 256:
            return LoadOverride(n_ctx=n_ctx)
        return chosen

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
        prefs = self._preferences(info, override, model)
        try:
            outcome = load(model.path, info, self.settings.load_settings(), self._hardware,
                           prefs, self._journal,
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
        vision = self._vision(model, llama, override, prefs)
        self.loaded = Loaded(model, llama, fmt, single_tokens(llama, fmt.turn_ends),
                             self._prompt_cache(model),
                             self._compare(outcome.plan, llama, info.architecture, vision.projector),
                             plan=outcome.plan, override=override, notes=outcome.notes,
                             adapters=AdapterBank(llama),
                             marker_tokens=control_tokens(llama, fmt.family.markers()),
                             vision=vision)
        return self.loaded

    def _vision(self, model: LocalModel, llama: LlamaModel, override: LoadOverride | None,
                prefs: Preferences) -> LoadedVision:
        """The model's projector, loaded where the plan counted it (a projector that
        fails to load leaves the model without vision, saying why)."""
        facts, why = wanted_projector(model, llama.n_embd, override)
        if facts is None:
            return LoadedVision(None, why)
        device = (where_projector(self._hardware, prefs) if self._hardware else None) or "CPU"
        try:
            projector = load_projector(facts, llama, device, self.settings.load.n_threads,
                                       self.settings.image_tokens)
        except ModelLoadFailed as exc:
            return LoadedVision(None, exc.message)
        folder = self.settings.cache_folder
        return LoadedVision(projector, None, ImageCache(
            folder / "images" / model_fingerprint(Path(facts.path)) if folder else None))

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
        self.drafts.close()

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
        eyes, _ = wanted_projector(model, info.shape.n_embd if info.shape else None, override)
        chosen = dict(gpu_layers=override.gpu_layers if override else None, draft=draft,
                      projector_bytes=eyes.total_bytes if eyes else 0,
                      image_flops=eyes.image_flops(1024, 768) if eyes else 0.0,
                      calibration=self._calibration.for_architecture(info.architecture),
                      cpu_moe_layers=cpu_moe, speed_calibration=self._calibration.speeds(),
                      tensor_parallel=self.settings.tensor_parallel,
                      parallel=self.settings.parallel, kv_layout=self.settings.kv_layout)
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

    def _compare(self, planned, llama: LlamaModel, arch: str, projector=None) -> dict | None:
        """Measured against predicted bytes per device; the ratios calibrate later plans."""
        if planned is None:
            return None
        measured: dict[str, int] = {}
        extra = projector.buffers if projector else {}
        for (device, _kind), size in [*llama.buffers.items(), *extra.items()]:
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

    def speculation(self, request: GenerationRequest, notes: list[str],
                    spare_seq: int, busy: set[int] = frozenset()) -> Speculation | None:
        """The request's speculation over the loaded model (drafts.py)."""
        return self.drafts.speculation(self.loaded, request, notes, spare_seq, busy)
