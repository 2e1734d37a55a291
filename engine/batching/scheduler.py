"""Continuous batching: every step evaluates the next token of all decoding sequences in
one llama_decode, as llama.cpp's server does (`update_slots`), then chunks of waiting
prompts, capped so that running streams do not stall; each sequence samples at its own
batch index.

A request joins at the next step and leaves when it ends. All sequences draw on one pool
of KV cells (kv_pool.py); which conversation holds which sequence and its cells, who stays
resident and who is saved to the prompt cache, is residency.py's to decide: a new request
starts from the sequence sharing the longest prefix with its prompt.

A step is planned (plan.py's `plan_batch`, pure: which tokens and prompt chunks, in which calls),
run (`_evaluate`: the llama.cpp calls) and its picks applied (`_sample`, `_advance`: each
sequence's token, its end, a sequence that outgrew the memory).
"""

from __future__ import annotations

import time
from dataclasses import replace

from ..errors import GrammarTooSlow, MemoryFull, NonFiniteLogits
from ..events import CANCELLED, Failed, Job, Started, Usage
from ..llama.runtime import Chunk, DecodeFailed, NoKVSlot
from ..prefix import common_prefix
from ..llama.sampler import Sampler
from ..machine.planner import lanes
from ..model.host import ModelHost
from ..model.loaded import Prompt
from ..settings import EngineSettings
from .budget import ReasoningBudget
from .plan import plan_batch, take_turn
from .residency import Residency
from .slot import Output, Slot
from .throughput import Throughput
from ..speculation.verify import speculative_step

class Scheduler:
    """The slots of the loaded model and the step that advances them. Worker thread only."""

    def __init__(self, host: ModelHost, settings: EngineSettings):
        self.host, self.settings = host, settings
        self.figures = Throughput()
        self.residency = Residency(host, settings, self.figures)  # who holds which cells
        self._last_set: tuple = ()  # the adapter set the last step advanced
        self._run = 0  # steps in a row it advanced
        self._decode_s = 0.0  # this step's time in llama_decode so far
        self.lanes, self.lanes_why = lanes(0, settings.parallel)  # set by each load

    # -- the loaded model -------------------------------------------------------------

    def attach(self) -> None:
        """A model was loaded: its memory is empty, and its plan sets the lanes (without
        one, its context)."""
        loaded = self.host.loaded
        self.residency.attach(loaded.llama)
        if loaded.plan is not None and loaded.plan.lanes_why:
            self.lanes, self.lanes_why = loaded.plan.lanes, loaded.plan.lanes_why
        else:
            self.lanes, self.lanes_why = lanes(loaded.llama.n_ctx, self.settings.parallel)

    @property
    def spare_sequence(self) -> int:
        """A sequence id no request uses, for measurements."""
        return self.residency.spare

    @property
    def active(self) -> list[Slot]:
        return self.residency.active

    def has_room(self) -> bool:
        return len(self.active) < self.lanes

    # -- admission --------------------------------------------------------------------

    def admit(self, job: Job) -> bool:
        """Give `job` a sequence, its prompt's prefix taken from the best source; False
        (the job not taken) when the KV memory cannot hold the prompt until others end."""
        held = self.host.loaded.prompt(job.request)
        try:
            admitted = self._admit(job, held)
        except NonFiniteLogits as exc:  # measuring a drafter's tie margin, at admission
            held.close()
            raise self._model_error(exc, len(held.tokens)) from None
        except BaseException:
            held.close()
            raise
        if not admitted:
            held.close()
        return admitted

    def _admit(self, job: Job, held: Prompt) -> bool:
        loaded, request = self.host.loaded, job.request
        prompt, notes = held.tokens, held.notes
        max_tokens, clamped = loaded.budget(request, len(prompt))
        kv = self.residency
        busy = kv.active  # what they use stays loaded
        budget = reasoning_budget(request, loaded)
        # a forced ending, or images (their spans are no tokens a drafter could read): no drafts
        spec = None if budget and budget.limit or held.images else self.host.speculation(
            request, notes, self.spare_sequence, busy={id(s.spec.drafter) for s in busy if s.spec})
        # a file llama.cpp refuses fails this job alone
        for stale in loaded.adapters.ready(request.adapters,
                                           busy={path for s in busy for path, _ in s.adapters}):
            kv.drop_resident(lambda slot: any(path == stale for path, _ in slot.adapters))
        source, keep = kv.best_source(prompt, request.adapter_set, request.client) \
            if request.cache_prompt else (None, 0)
        waiting = sum(len(s.pending()) for s in self.active)  # prompts admitted, not yet held
        if not kv.make_room(len(prompt) - keep + 1 + waiting, spare=source):
            if self.active:
                return False
            keep, source = 0, None  # only residents hold cells: start afresh
            kv.make_room(len(prompt) + 1, spare=None)
        # made before a slot is taken: a grammar llama.cpp rejects fails the request alone
        sampler = Sampler(request.sampling, loaded.llama.n_vocab, request.grammar,
                          loaded.llama.vocab)
        slot = kv.slot_for(source, keep)
        slot.adapters, slot.client = request.adapter_set, request.client
        slot.precedence = request.precedence
        if request.cache_prompt:
            kv.restore_longer(slot, prompt)
        kv.trim(slot, common_prefix(slot.tokens, prompt[:-1]))
        kv.verify(slot)
        slot.begin(job, held, sampler, spec, Output(
            job, loaded.llama, loaded.chat_format.turn_ends, loaded.turn_end_tokens, max_tokens,
            loaded.marker_tokens if request.messages is not None else frozenset(), budget))
        answering = "+".join([loaded.model.id, *(use.adapter.id for use in request.adapters)])
        slot.started = Started(answering, len(prompt), slot.n_cached, max_tokens,
                               loaded.llama.n_ctx,
                               loaded.chat_format.describe() if request.messages else None,
                               tuple(notes + clamped),
                               adapters=tuple(u.as_dict() for u in request.adapters))
        self.figures.totals["requests"] += 1
        return True

    # -- the step ---------------------------------------------------------------------

    def step(self) -> None:
        """Advance every active sequence once: a draft round for a lone speculating one,
        else one batch of the next tokens and prompt chunks of all."""
        self._drop_cancelled()
        self._last_set, active, self._run = take_turn(self.active, self._last_set, self._run)
        if not active:
            return
        self.host.loaded.adapters.apply(self._last_set)
        lone = active[0] if len(active) == 1 and active[0].decoding else None
        if lone and lone.spec and not lone.spec.controller.wants_plain():
            self._speculate(lone)
            return
        started, self._decode_s = time.perf_counter(), 0.0
        if not self._evaluate_batch(active):
            return
        took = time.perf_counter() - started
        if lone and lone.spec:  # a plain step's time: what drafting is measured against
            lone.spec.controller.record_plain(took)
        self.figures.totals["steps"] += 1
        self.figures.step_s += took
        self.figures.decode_s += self._decode_s

    def _evaluate_batch(self, active: list[Slot]) -> bool:
        """The batch in as few llama_decode calls as n_batch allows; False when the KV
        memory could not hold it (then the sequences that outgrew it have ended)."""
        calls = plan_batch(active, self.host.loaded.llama.settings.n_batch,
                           invariant=self.settings.batch_invariant)
        if not self.residency.make_room(sum(len(c.tokens) for call in calls for c in call),
                                        spare=None):
            self._outgrown(active)
            return False
        for call in calls:
            try:
                self._evaluate(call)
            except NoKVSlot:  # the ledger saw room llama.cpp did not find: one leaves
                self._outgrown([s for s in self.active if s.seq_id in
                                {c.seq_id for c in call}] or self.active)
                return False
        return True

    def _evaluate(self, call: list[Chunk]) -> None:
        """One llama_decode, then the picks of the slots it computed logits for."""
        if call[0].image is not None:
            self._evaluate_image(call[0])
            return
        started = time.perf_counter()
        ends = self.host.loaded.llama.decode_chunks(call)
        self._decode_s += time.perf_counter() - started  # the step's share in llama_decode
        picks = []
        for chunk, end in zip(call, ends):
            slot = self.residency.slots[chunk.seq_id]
            self.residency.extend(slot, chunk.tokens)
            slot.peers = max(slot.peers, len(call))
            if not slot.decoding:
                self.figures.count(prompt=len(chunk.tokens))
            slot.last = None
            if chunk.logits:
                picks.append((slot, end))
        self._sample(picks)

    def _evaluate_image(self, chunk: Chunk) -> None:
        """An image into its sequence: its embeddings kept or encoded now, then decoded."""
        loaded, slot = self.host.loaded, self.residency.slots[chunk.seq_id]
        vision = loaded.vision
        started, encoded = time.perf_counter(), vision.images.encoded
        embeddings = vision.images.embeddings(vision.projector, chunk.image)
        if vision.images.encoded > encoded:  # the tower ran (a kept one costs no encode)
            slot.encode_s += time.perf_counter() - started
        end = vision.projector.decode(loaded.llama, chunk, embeddings)
        if end != chunk.start + len(chunk.tokens):
            raise DecodeFailed(f"an image took {end - chunk.start} positions, not "
                               f"{len(chunk.tokens)}")
        self.residency.extend(slot, chunk.tokens)
        self.figures.count(prompt=len(chunk.tokens))

    def _sample(self, picks: list[tuple[Slot, int]]) -> None:
        """Each slot samples at its own batch index."""
        llama = self.host.loaded.llama
        for slot, end in picks:
            try:
                token = slot.sampler.sample(llama, end)
            except (GrammarTooSlow, NonFiniteLogits) as exc:  # this one ends; others go on
                self._fail(slot, exc)
                continue
            if slot.job.request.measure_confidence:
                slot.output.weigh(llama.logits(end), token)
            self._advance(slot, token)

    def _advance(self, slot: Slot, token: int) -> None:
        """A token was sampled for the slot: the first starts its stream."""
        output, first = slot.output, slot.output.produced == 0
        if first:
            slot.job.emit(slot.started)
        self.figures.count(generated=1)
        if not output.take(token):
            self._finish(slot)
            return
        if output.forced:  # the reasoning budget is spent: its closing marker comes next
            slot.sampler.force(output.forced)
            output.forced = []
        slot.last = token
        if first and slot.spec:  # the draft catches up after the first token is out
            slot.spec.drafter.follow([*slot.tokens, token])

    def _speculate(self, slot: Slot) -> None:
        """A lone decoding sequence with a drafter: one speculative round."""
        llama, output = self.host.loaded.llama, slot.output
        room = min(output.max_tokens - output.produced, llama.n_ctx - len(slot.tokens))
        if not self.residency.make_room(min(slot.spec.controller.k, room) + 1, spare=None):
            self._outgrown([slot])
            return
        try:
            tokens = speculative_step(llama, slot.tokens, slot.last, slot.spec, slot.sampler,
                                      slot.seq_id, room) if room >= 2 else []
            self.residency.follow(slot)
            if not tokens:  # the next token needs a plain step
                self._evaluate([Chunk(slot.seq_id, len(slot.tokens), (slot.last,), True)])
                return
        except NoKVSlot:  # as in a plain step: the sequence ends, the engine goes on
            self._outgrown([slot])
            return
        except (GrammarTooSlow, NonFiniteLogits) as exc:
            self._fail(slot, exc)
            return
        slot.last = None
        for token in tokens:
            self.figures.count(generated=1)
            if not output.take(token):
                self._finish(slot)
                return
        slot.last = tokens[-1]

    def _outgrown(self, active: list[Slot]) -> None:
        """The pool is full and no resident can make room: the sequence holding the most
        cells fails (a device's before the owner's), so the others go on."""
        ledger = self.residency.ledger  # a device's sequence before the owner's
        victim = max(active, key=lambda s: (s.client is not None, ledger.held(s.seq_id)))
        self.figures.totals["memory_full"] += 1
        used, total = ledger.held(victim.seq_id), ledger.total
        shared = f"its own KV stream of {self.host.loaded.llama.n_ctx}" if ledger.split else \
            f"the {total} cells that {len(active)} concurrent requests share"
        self._fail(victim, MemoryFull(
            f"the KV memory is full: this request held {used} of {shared}; retry when "
            "fewer are running, or load the model with a larger context"))

    # -- leaving ------------------------------------------------------------------------

    def _drop_cancelled(self) -> None:
        for slot in self.active:
            if slot.job.cancelled.is_set() and slot.output.produced == 0:
                slot.job.emit(CANCELLED)
                self.residency.release(slot)

    def _finish(self, slot: Slot) -> None:
        output = slot.output
        usage = slot.usage()
        if slot.spec:
            usage = _with_spec(usage, slot.spec)
        output.finish(usage)
        self.figures.request_took(time.perf_counter() - slot.admitted)
        self.host.record_speed(usage)
        if output.reason == "cancelled" or not slot.job.request.cache_prompt:
            self.residency.release(slot)
        else:
            slot.end()
            self.residency.keep_at_most(self.settings.resident)
        self.host.mark_evaluated()

    def _fail(self, slot: Slot, error) -> None:
        """The sequence ends with `error`, its cells dropped unsaved (logits that were no
        numbers leave cells that are none either: nothing of it is kept)."""
        if isinstance(error, NonFiniteLogits):
            error = self._model_error(error, len(slot.tokens))
        slot.job.emit(Failed(error))
        self.residency.release(slot)

    def _model_error(self, error: NonFiniteLogits, position: int) -> NonFiniteLogits:
        """The error a request ends with, at its position, counted (/metrics)."""
        self.figures.totals["model_errors"] += 1
        return error.at(position)

    def fail_all(self, error) -> None:
        """After an evaluation failed: the memory may not match any token list."""
        for slot in self.active:
            slot.job.emit(Failed(error))
            slot.end()
        self.residency.clear()
        loaded = self.host.loaded
        if loaded:
            loaded.llama.clear()
            loaded.reset_drafters()

    # -- figures ------------------------------------------------------------------------

    def status(self) -> dict:
        active = self.active
        prompt_rate, generated_rate = self.figures.rates()
        return {"active": len(active),
                "prefilling": sum(s.prefilling for s in active),
                "resident": len(self.residency.slots) - len(active),
                "parallel": self.lanes, "lanes_why": self.lanes_why,
                "kv_layout": "split" if self.residency.ledger.split else "unified",
                "kv_cells_used": self.residency.ledger.used,
                "kv_cells_total": self.residency.ledger.total,
                "prompt_tokens_per_s": round(prompt_rate, 2),
                "generated_tokens_per_s": round(generated_rate, 2),
                "host_ms_per_step": self.figures.host_ms_per_step(),
                "decode_ms_per_step": self.figures.decode_ms_per_step(),
                "graphs_reused": loaded.llama.graphs_reused if (loaded := self.host.loaded) else 0,
                **self.figures.totals}



def reasoning_budget(request, loaded) -> ReasoningBudget | None:
    """Where the answer reasons, over its model's reasoning markers, with the request's
    budget: when it has one, or measures its confidence (the cascade judges the answer
    alone); None for a model whose family has no markers."""
    think = loaded.chat_format.family.think
    wanted = request.thinking_budget is not None or request.measure_confidence
    if not wanted or request.messages is None or think is None:
        return None
    opening, closing = think
    tokens = loaded.llama.tokenize(closing, add_special=False, parse_special=True)
    opened = request.rendered.opens_thinking()
    return ReasoningBudget(request.thinking_budget, opening, closing, opened, tokens)


def _with_spec(usage: Usage, spec) -> Usage:
    usage = replace(usage, speculative={**spec.stats.as_dict(spec.controller),
                                        "tie_margin": round(spec.tie_margin, 3),
                                        "note": spec.controller.note})
    spec.controller.note = None
    return usage
