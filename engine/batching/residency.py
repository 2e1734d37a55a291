"""KV residency: which conversation holds which sequence of the loaded model, and the
cells it holds (kv_pool.py's ledger, mirroring llama.cpp's cache, unified or split).

A finished conversation stays resident as an idle sequence until its cells or its
sequence id are needed, and is saved to the prompt cache's RAM and disk tiers only then
(least recently used first). A new prompt starts from the sequence sharing its longest
prefix: an idle conversation it continues is taken over in place, any other lends its
prefix's cells (llama_memory_seq_cp; in a split cache, a copy of its stream, made only
for a prefix worth it; where a sequence must leave anyway, that idle one leaves, saved,
and serves in place), and the prompt cache's tiers are asked for a longer one. The
scheduler admits (`seat`) and steps; this room decides what stays in memory.
"""

from __future__ import annotations

from ..prefix import common_prefix
from ..model.host import ModelHost
from ..settings import EngineSettings
from .kv_pool import CellLedger
from .slot import Slot
from .throughput import Throughput

SEAM = 8  # tokens a template may render anew at the end of the previous answer
# A split cache copies a prefix as its source's whole stream (n_ctx cells of every
# layer): SmolLM2's 8k stream in 15 ms on this CPU, where a lone prompt of 8 tokens takes
# 23 ms and 16 take 38. Prompts evaluated together cost less a token, so a prefix is
# copied from 16 tokens on (sixteen clients arriving at once share a dozen).
SPLIT_COPY_MIN = 16
# Where a sequence must leave for a new prompt anyway, an idle one sharing at least this
# many tokens with it is the one that leaves (saved first) and serves in place.
IN_PLACE_MIN = 8


class Residency:
    """The sequences of the loaded model and their cells. Worker thread only."""

    def __init__(self, host: ModelHost, settings: EngineSettings, figures: Throughput):
        self.host, self.settings, self.figures = host, settings, figures
        self.slots: dict[int, Slot] = {}  # seq id -> slot, active or resident
        self.ledger = CellLedger(0)
        self.spare = settings.sequences - 1  # the sequence no request uses (measurements)

    def attach(self, llama) -> None:
        """A model was loaded (`llama`, its context): its memory is empty."""
        self.slots.clear()
        self.ledger = CellLedger(llama.n_cells, llama.settings.kv_split)
        self.spare = llama.settings.n_seq_max - 1

    @property
    def active(self) -> list[Slot]:
        return [s for s in self.slots.values() if s.active]

    def idle(self, spare: Slot | None = None) -> list[Slot]:
        """Resident conversations, least recently used first."""
        return sorted((s for s in self.slots.values() if not s.active and s is not spare),
                      key=lambda s: s.used)

    # -- a prompt's sequence ------------------------------------------------------------

    def seat(self, prompt: list[int], request, stale: list[str]) -> Slot | None:
        """A sequence for the request's prompt, holding the longest prefix of it found in
        memory or the prompt cache, checked by the guard; None (nothing changed but
        evictions) when the KV memory cannot hold the prompt until others end. `stale`:
        adapter files replaced since residents were computed under them (those go)."""
        for path in stale:
            self.drop_resident(lambda slot: any(used == path for used, _ in slot.adapters))
        source, keep = self.best_source(prompt, request.adapter_set, request.client) \
            if request.cache_prompt else (None, 0)
        waiting = sum(len(s.pending()) for s in self.active)  # admitted, not yet held
        if not self.make_room(len(prompt) - keep + 1 + waiting, spare=source):
            if self.active:
                return None
            keep, source = 0, None  # only residents hold cells: start afresh
            self.make_room(len(prompt) + 1, spare=None)
        slot = self.slot_for(source, keep)
        slot.adapters, slot.client = request.adapter_set, request.client
        slot.precedence = request.precedence
        if request.cache_prompt:
            self.restore_longer(slot, prompt)
        self.trim(slot, common_prefix(slot.tokens, prompt[:-1]))
        self.verify(slot)
        return slot

    def best_source(self, prompt: list[int], adapters: tuple,
                    client: str | None) -> tuple[Slot | None, int]:
        """The sequence sharing the longest prefix with the prompt, its cells computed
        under the same adapters for the same client (the last prompt token is always
        evaluated: sampling needs its logits). Each device reuses only its own prompts:
        a prefix found in another's would tell it, in its cached_tokens and its speed,
        what another asked, token by token."""
        best, keep = None, 0
        for slot in self.slots.values():
            if slot.adapters != adapters or slot.client != client:
                continue
            n = min(common_prefix(slot.tokens, prompt), len(prompt) - 1)
            if n > keep:
                best, keep = slot, n
        return best, keep

    def slot_for(self, source: Slot | None, keep: int) -> Slot:
        """An idle conversation the prompt continues is taken over in place; otherwise
        a free sequence, holding the source's prefix in shared cells. In a split cache
        with no free sequence, an idle source sharing IN_PLACE_MIN tokens leaves (saved
        to the prompt cache first) and serves the prompt with its prefix where it is, as
        llama-server takes the slot whose prompt is most alike: no whole stream copied
        (nor a prefix under SPLIT_COPY_MIN evaluated again), no other conversation sent
        away for it."""
        if source is not None and not source.active:
            if _continues(source, keep):
                return source
            if self.ledger.split and keep >= IN_PLACE_MIN and not self._free_ids():
                self.save(source)  # it leaves: the caller cuts it back to the prefix
                self.figures.totals["evictions"] += 1
                return source
        slot = self._free_slot(spare=source)
        if slot is None:  # no other sequence id: the source must serve
            self.trim(source, keep)
            return source
        if self.ledger.split and keep < SPLIT_COPY_MIN:
            keep = 0
        if source is not None and keep:
            self.host.loaded.llama.copy_prefix(source.seq_id, slot.seq_id, keep)
            self.ledger.share(source.seq_id, slot.seq_id, keep)
            slot.tokens = source.tokens[:keep]
        return slot

    def _free_ids(self) -> set[int]:
        return set(range(self.spare)) - set(self.slots)

    def _free_slot(self, spare: Slot | None) -> Slot | None:
        ids = self._free_ids()
        if not ids:
            idle = self.idle(spare)
            if not idle:
                return None
            ids = {self.evict(idle[0])}
        slot = Slot(min(ids))
        self.slots[slot.seq_id] = slot
        return slot

    def restore_longer(self, slot: Slot, prompt: list[int]) -> None:
        """A longer prefix from the prompt cache's tiers, restored into the slot."""
        loaded = self.host.loaded
        cache, llama = loaded.cache, loaded.llama
        hit = cache.best(prompt, self._salt(slot)) if cache else None
        if hit is None or hit.length <= common_prefix(slot.tokens, prompt):
            return
        state = cache.fetch(hit)
        if state is not None and self.make_room(len(hit.entry.tokens), spare=slot):
            # llama.cpp empties the sequence first, and the state takes cells of its own
            # (none shared with the prefix the slot may have held): the ledger follows
            restored = llama.restore(slot.seq_id, state, hit.entry.tokens)
            self.ledger.drop(slot.seq_id)
            slot.tokens = list(hit.entry.tokens) if restored else []
            slot.saved = restored
        self.ledger.hold(slot.seq_id, len(slot.tokens))

    def trim(self, slot: Slot, keep: int) -> None:
        """The slot's sequence cut back to its first `keep` tokens."""
        if keep < len(slot.tokens):
            self._cut(slot, keep)
        self.ledger.hold(slot.seq_id, len(slot.tokens))

    def verify(self, slot: Slot) -> None:
        """The guard, before a prompt trusts the cells its slot holds (reused, copied,
        served in place or restored): the tokens they are known to hold (the runtime's
        record of every call into llama.cpp) against the slot's. Past their common
        prefix nothing is trusted: the sequence is cut back to it, and counted
        (/metrics kv_mismatches), so a bookkeeping mistake costs an evaluation, never
        an answer computed from another prompt."""
        held = self.host.loaded.llama.held.of(slot.seq_id)
        if held != slot.tokens:
            self.figures.totals["kv_mismatches"] += 1
            self._cut(slot, common_prefix(held, slot.tokens))
            self.ledger.hold(slot.seq_id, len(slot.tokens))

    def _cut(self, slot: Slot, keep: int) -> None:
        llama = self.host.loaded.llama
        if not llama.forget(slot.seq_id, keep):
            llama.forget(slot.seq_id, 0)
            keep = 0
        del slot.tokens[keep:]
        slot.saved = False

    def extend(self, slot: Slot, tokens) -> None:
        """Tokens evaluated into the slot's sequence."""
        slot.tokens.extend(tokens)
        self.follow(slot)

    def follow(self, slot: Slot) -> None:
        """The ledger holds what the slot's sequence holds (after a speculative round)."""
        self.ledger.hold(slot.seq_id, len(slot.tokens))

    # -- room, and who leaves -------------------------------------------------------------

    def make_room(self, cells: int, spare: Slot | None) -> bool:
        """Evict resident conversations until `cells` are free; False if they cannot be.
        A split cache has no pool to free: each sequence's stream holds its context
        (the budget keeps every request within it)."""
        if self.ledger.split:
            return True
        for slot in self.idle(spare):
            if self.ledger.free >= cells:
                break
            self.evict(slot)
        return self.ledger.free >= cells

    def evict(self, slot: Slot) -> int:
        """Drop a resident conversation, saving it to the prompt cache first."""
        self.save(slot)
        self.release(slot)
        self.figures.totals["evictions"] += 1
        return slot.seq_id

    def keep_at_most(self, resident: int) -> None:
        """Beyond `resident` idle conversations (0: no limit), the oldest go to the
        prompt cache."""
        for extra in self.idle()[:-resident or None]:
            self.evict(extra)

    def release(self, slot: Slot) -> None:
        """The sequence leaves with its cells at once, unsaved."""
        slot.end()
        self.host.loaded.llama.forget(slot.seq_id, 0)
        self.ledger.drop(slot.seq_id)
        del self.slots[slot.seq_id]

    def drop_resident(self, which) -> None:
        """Forget the resident conversations `which` picks, unsaved (their states were
        computed under an adapter file since replaced)."""
        for slot in self.idle():
            if which(slot):
                self.release(slot)

    def clear(self) -> None:
        """After an evaluation failed: the memory may not match any token list."""
        self.slots.clear()
        self.ledger.clear()

    # -- the prompt cache -----------------------------------------------------------------

    def save(self, slot: Slot) -> None:
        loaded = self.host.loaded
        if loaded.cache and not slot.saved and slot.tokens:
            loaded.cache.save(slot.tokens, loaded.llama.snapshot(slot.seq_id),
                              self._salt(slot))
            slot.saved = True

    def _salt(self, slot: Slot) -> str:
        """The prompt cache's key part beside the tokens: the adapters the state was
        computed under, and the device whose it is (best_source's rule, kept there too)."""
        salt = self.host.loaded.adapters.salt(slot.adapters)
        return salt if slot.client is None else f"{salt}@{slot.client}"

    def save_one(self) -> bool:
        """Save one resident conversation the cache lacks (when the engine is idle)."""
        for slot in self.idle():
            if not slot.saved and self.host.loaded.cache:
                self.save(slot)
                return True
        return False

    def save_all(self) -> None:
        for slot in self.idle():
            self.save(slot)


def _continues(slot: Slot, keep: int) -> bool:
    """The prompt continues the slot's conversation: at most its last few tokens differ
    (a chat template renders the previous answer's ending anew)."""
    return len(slot.tokens) - keep <= SEAM
