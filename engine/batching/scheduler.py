"""Continuous batching: every step evaluates the next token of all decoding sequences in
one llama_decode, as llama.cpp's server does (`update_slots`), then chunks of waiting
prompts, capped so that running streams do not stall; each sequence samples at its own
batch index.

A request joins at the next step and leaves when it ends. All sequences draw on one pool
of KV cells (kv_pool.py); which conversation holds which sequence and its cells, who stays
resident and who is saved to the prompt cache, is residency.py's to decide: a new request
is seated (`Residency.seat`) in the sequence sharing the longest prefix with its prompt.

A step is scheduled (plan.py, pure: the adapter set's turn, a draft round or the tokens
and prompt chunks of each call), run (run.py: the llama.cpp calls and the sampling, token
ids out) and updated here (each sequence's tokens into its stream, its end, a sequence
that outgrew the memory).
"""

from __future__ import annotations

import time
from dataclasses import replace

from ..errors import HomerackError, MemoryFull, NonFiniteLogits
from ..events import CANCELLED, Failed, Job, Started
from ..llama.sampler import Sampler
from ..machine.planner import lanes
from ..model.host import ModelHost
from ..model.loaded import Prompt
from ..settings import EngineSettings
from .budget import reasoning_budget
from .plan import Plan, schedule
from .residency import Residency
from .run import Picks, Runner
from .slot import Output, Slot
from .throughput import Throughput

class Scheduler:
    """The slots of the loaded model and the step that advances them. Worker thread only."""

    def __init__(self, host: ModelHost, settings: EngineSettings):
        self.host, self.settings = host, settings
        self.figures = Throughput()
        self.residency = Residency(host, settings, self.figures)  # who holds which cells
        self.runner = Runner(host, self.residency, self.figures)
        self._last_set: tuple = ()  # the adapter set the last step advanced
        self._run = 0  # steps in a row it advanced
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
        busy = self.active  # what they use stays loaded
        budget = reasoning_budget(request, loaded)
        # a forced ending, or images (their spans are no tokens a drafter could read): no drafts
        spec = None if budget and budget.limit or held.images else self.host.speculation(
            request, notes, self.spare_sequence, busy={id(s.spec.drafter) for s in busy if s.spec})
        # a file llama.cpp refuses fails this job alone
        stale = loaded.adapters.ready(request.adapters,
                                      busy={path for s in busy for path, _ in s.adapters})
        slot = self.residency.seat(prompt, request, stale)
        if slot is None:
            return False
        # a grammar llama.cpp rejects (or any error past here) fails the request alone;
        # its seat stays an idle resident, holding what it truly holds
        try:
            sampler = Sampler(request.sampling, loaded.llama.n_vocab, request.grammar,
                              loaded.llama.vocab)
            slot.begin(job, held, sampler, spec, Output(
                job, loaded.llama, loaded.chat_format.turn_ends, loaded.turn_end_tokens,
                max_tokens, loaded.marker_tokens if request.messages is not None
                else frozenset(), budget))
        except BaseException:
            slot.held = None  # the caller closes the prompt it holds
            slot.end()
            raise
        answering = "+".join([loaded.model.id, *(use.adapter.id for use in request.adapters)])
        slot.started = Started(answering, len(prompt), slot.n_cached, max_tokens,
                               loaded.llama.n_ctx,
                               loaded.chat_format.describe() if request.messages else None,
                               tuple(notes + clamped),
                               adapters=tuple(u.as_dict() for u in request.adapters))
        self.figures.totals["requests"] += 1
        return True

    # -- the step: schedule, run, update -------------------------------------------------

    def step(self) -> None:
        """Advance every active sequence once: a draft round for a lone speculating one,
        else one batch of the next tokens and prompt chunks of all."""
        self._drop_cancelled()
        plan = self.schedule()
        if plan is None:
            return
        lone = plan.slots[0] if len(plan.slots) == 1 and plan.slots[0].decoding else None
        started = time.perf_counter()
        picks = self.runner.run(plan)
        self.update(picks)
        if plan.draft is not None or picks.outgrown:
            return
        took = time.perf_counter() - started
        if lone and lone.spec:  # a plain step's time: what drafting is measured against
            lone.spec.controller.record_plain(took)
        self.figures.totals["steps"] += 1
        self.figures.step_s += took
        self.figures.decode_s += picks.decode_s

    def schedule(self) -> Plan | None:
        """The next step's plan (plan.py), the adapter sets taking turns."""
        plan = schedule(self.active, self._last_set, self._run,
                        self.host.loaded.llama.settings.n_batch, self.settings.batch_invariant)
        if plan is None:
            self._run = 0
            return None
        self._last_set, self._run = plan.adapters, plan.turn
        return plan

    def update(self, picks: Picks) -> None:
        """Each picked token into its request's stream; failed picks end their sequences;
        when the memory was outgrown, one sequence leaves so the others go on."""
        for slot, tokens in picks.tokens:
            try:
                for token in tokens:
                    if not self._advance(slot, token):
                        break
            except Exception as exc:  # its text, its stream: this request's alone
                self._fail(slot, as_error(exc))
        for slot, error in picks.failed:
            self._fail(slot, error)
        if picks.outgrown:  # those still running, or any running when all of them ended
            victims = [s for s in picks.outgrown if s.active] or self.active
            if victims:
                self._outgrown(victims)

    def _advance(self, slot: Slot, token: int) -> bool:
        """A token was picked for the slot (the first starts its stream); False when it
        ended the answer."""
        output, first = slot.output, slot.output.produced == 0
        if first:
            slot.job.emit(slot.started)
        self.figures.count(generated=1)
        if not output.take(token):
            self._finish(slot)
            return False
        if output.forced:  # the reasoning budget is spent: its closing marker comes next
            slot.sampler.force(output.forced)
            output.forced = []
        slot.last = token
        if first and slot.spec:  # the draft catches up after the first token is out
            slot.spec.drafter.follow([*slot.tokens, token])
        return True

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
            usage = replace(usage, speculative=slot.spec.report())
        output.finish(usage)
        self.figures.request_took(time.perf_counter() - slot.admitted)
        self.host.record_speed(usage)
        # a stopped answer's conversation stays resident as a finished one does: a chat's
        # next turn resends it (the page kept what had come) and starts from its cells
        if not slot.job.request.cache_prompt:
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
        slot.job.emit(Failed(as_error(error)))
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


def as_error(exc: Exception) -> HomerackError:
    """What a request fails with: the engine's own error, or any other said as internal."""
    return exc if isinstance(exc, HomerackError) else HomerackError(f"internal error: {exc!r}")
