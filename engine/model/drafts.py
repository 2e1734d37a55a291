"""The draft side of speculation for the loaded model: which drafter a request gets
(lookup, or a draft model picked or named), loading it cut where it can be
(speculation/cut_draft.py) on the device the planner gives it, keeping the few most
recently used, and the controllers that turn speculation off where it measures slower.
Used from the engine's worker thread only."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import psutil

from ..catalog.drafts import check_draft_fits, pick_draft
from ..catalog.models import LocalModel, ModelStore
from ..errors import OutOfMemory
from ..events import GenerationRequest
from ..llama.runtime import LlamaModel
from ..machine.planner import draft_bytes, place_draft
from ..settings import EngineSettings
from ..speculation import cut_draft
from ..speculation.controller import TIE_MARGIN, SpecController, Speculation, SpecStats
from ..speculation.drafters import LookupDrafter, ModelDrafter
from ..speculation.verify import tie_margin
from .loaded import Loaded

MAX_DRAFTERS = 2  # draft models held per loaded model (requests may name others in turn)


class Drafts:
    def __init__(self, store: ModelStore, settings: EngineSettings):
        self.store, self.settings = store, settings
        self.controllers: dict[tuple, SpecController] = {}
        self._cuts = cut_draft.DraftCuts(settings.draft_folder)
        self._whole_drafts: set[Path] = set()  # drafts whose cut missed too much text

    def close(self) -> None:
        """Let cuts being built finish (a one-shot engine would otherwise never keep one)."""
        self._cuts.wait(timeout=60)

    def measure_tie_margin(self, loaded: Loaded, spare_seq: int) -> float:
        """The loaded model's tie margin (speculative.tie_margin), measured once in a
        sequence no request uses."""
        if loaded.tie_margin is None:
            loaded.tie_margin = tie_margin(loaded.llama, [], spare_seq)
        return loaded.tie_margin

    def speculation(self, loaded: Loaded, request: GenerationRequest, notes: list[str],
                    spare_seq: int, busy: set[int] = frozenset()) -> Speculation | None:
        """The request's speculation, its drafter loaded if need be; `busy`: the ids of the
        drafters running requests use (never closed under them)."""
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
            key = self._ready_draft(loaded, request, notes, busy)
            if key is None:
                return None
        self._keep_recent(loaded, key, busy)
        controller = self.controllers.setdefault(
            (str(loaded.model.path), key), SpecController(min_speedup=self.settings.spec_min_speedup))
        controller.start_request()
        drafter = loaded.drafters[key]
        margin = TIE_MARGIN
        if request.sampling.temperature <= 0:  # greedy exactness needs it (verify)
            margin = self.measure_tie_margin(loaded, spare_seq)
        return Speculation(drafter, controller, SpecStats(
            mode, model=drafter.model_id, device=drafter.device, vocab=drafter.vocab), margin)

    def _keep_recent(self, loaded: Loaded, key: str, busy: set[int]) -> None:
        """`key` the most recently used drafter; the least recently used beyond
        MAX_DRAFTERS that no running request uses closed, their memory given back."""
        drafters = loaded.drafters
        drafters[key] = drafters.pop(key)
        spare = [k for k, d in drafters.items() if k != key and id(d) not in busy]
        for old in spare[:max(0, len(drafters) - MAX_DRAFTERS)]:
            drafters.pop(old).close()

    def _ready_draft(self, loaded: Loaded, request: GenerationRequest, notes: list[str],
                     busy: set[int]) -> str | None:
        """The key of the request's draft among the loaded model's drafters, loaded (cut
        when it can be); None, said in `notes`, when there is none or no room for it."""
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
                drafter = self._load_draft(loaded, draft, cut, notes)
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

    def _load_draft(self, loaded: Loaded, draft: LocalModel, cut: cut_draft.CutDraft | None,
                    notes: list[str]) -> ModelDrafter:
        """The draft, cut if it can be, on the fastest device with room for it (see
        planner.place_draft); on the CPU when that fails for memory."""
        llama, device = self._open_draft(loaded, draft, cut.model if cut else draft.path)
        if cut is None:
            return ModelDrafter(llama, draft.id, device=device)
        try:
            cut_draft.load(cut, llama)
        except cut_draft.DraftCutFailed as exc:
            llama.close()
            notes.append(f"the draft runs whole: {exc}")
            return self._load_draft(loaded, draft, None, notes)
        return ModelDrafter(llama, draft.id, device=device, head=cut.keep)

    def _open_draft(self, loaded: Loaded, draft: LocalModel, path: Path) -> tuple[LlamaModel, str]:
        """The draft at the target's context, where the planner puts it; OutOfMemory
        before llama.cpp when no device has room (RAM as free now)."""
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
