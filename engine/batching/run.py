"""A step's plan carried out: the llama.cpp calls (llama_decode of each call, an image's
embeddings, a draft round), what the sequences' cells now hold, and each sequence's pick
sampled at its own batch index. Token ids come out (`Picks`); what they mean for each
request (its stream, its end) is the scheduler's update.

Sampling stays with the call that computed the logits: llama.cpp keeps only the last
llama_decode's, and a step may take several calls when its tokens exceed n_batch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ..errors import GrammarTooSlow, NonFiniteLogits
from ..llama.runtime import Chunk, DecodeFailed, NoKVSlot
from ..model.host import ModelHost
from ..speculation.verify import speculative_step
from .plan import Plan
from .residency import Residency
from .slot import Slot
from .throughput import Throughput


@dataclass
class Picks:
    """What a step produced: the tokens each sequence picked (a draft round may keep
    several), the sequences whose pick failed and why, and those the KV memory could not
    hold (one of them must leave)."""
    tokens: list[tuple[Slot, tuple[int, ...]]] = field(default_factory=list)
    failed: list[tuple[Slot, Exception]] = field(default_factory=list)
    outgrown: list[Slot] = field(default_factory=list)
    decode_s: float = 0.0  # the step's time inside llama_decode


class Runner:
    """Carries out plans on the loaded model. Worker thread only."""

    def __init__(self, host: ModelHost, residency: Residency, figures: Throughput):
        self.host, self.residency, self.figures = host, residency, figures

    def run(self, plan: Plan) -> Picks:
        self.host.loaded.adapters.apply(plan.adapters)
        if plan.draft is not None:
            return self._draft_round(plan.draft)
        picks = Picks()
        if not self.residency.make_room(sum(len(c.tokens) for call in plan.calls for c in call),
                                        spare=None):
            picks.outgrown = list(plan.slots)
            return picks
        for call in plan.calls:
            try:
                self._evaluate(call, picks)
            except NoKVSlot:  # the ledger saw room llama.cpp did not find: one leaves
                seqs = {c.seq_id for c in call}
                picks.outgrown = [s for s in self.residency.active if s.seq_id in seqs] \
                    or self.residency.active
                break
        return picks

    def _evaluate(self, call: list[Chunk], picks: Picks) -> None:
        """One llama_decode, then the picks of the slots it computed logits for."""
        if call[0].image is not None:
            self._evaluate_image(call[0])
            return
        started = time.perf_counter()
        ends = self.host.loaded.llama.decode_chunks(call)
        picks.decode_s += time.perf_counter() - started
        asked = []
        for chunk, end in zip(call, ends):
            slot = self.residency.slots[chunk.seq_id]
            self.residency.extend(slot, chunk.tokens)
            slot.peers = max(slot.peers, len(call))
            if not slot.decoding:
                self.figures.count(prompt=len(chunk.tokens))
            slot.last = None
            if chunk.logits:
                asked.append((slot, end))
        self._sample(asked, picks)

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

    def _sample(self, asked: list[tuple[Slot, int]], picks: Picks) -> None:
        """Each slot samples at its own batch index; a failed pick ends that slot alone."""
        llama = self.host.loaded.llama
        for slot, end in asked:
            try:
                token = slot.sampler.sample(llama, end)
                if slot.job.request.measure_confidence:
                    slot.output.weigh(llama.logits(end), token)
            except Exception as exc:  # a grammar too slow, logits no numbers, any other:
                picks.failed.append((slot, exc))  # this pick's alone
                continue
            picks.tokens.append((slot, (token,)))

    def _draft_round(self, slot: Slot) -> Picks:
        """A lone decoding sequence with a drafter: one speculative round (or a plain
        step, when too little room is left for a draft)."""
        llama, output, picks = self.host.loaded.llama, slot.output, Picks()
        room = min(output.max_tokens - output.produced, llama.n_ctx - len(slot.tokens))
        if not self.residency.make_room(min(slot.spec.controller.k, room) + 1, spare=None):
            picks.outgrown = [slot]
            return picks
        try:
            tokens = speculative_step(llama, slot.tokens, slot.last, slot.spec, slot.sampler,
                                      slot.seq_id, room) if room >= 2 else []
            self.residency.follow(slot)
            if not tokens:  # the next token needs a plain step
                self._evaluate([Chunk(slot.seq_id, len(slot.tokens), (slot.last,), True)], picks)
                return picks
        except NoKVSlot:  # as in a plain step: the sequence ends, the engine goes on
            picks.outgrown = [slot]
            return picks
        except (GrammarTooSlow, NonFiniteLogits) as exc:
            picks.failed.append((slot, exc))
            return picks
        slot.last = None
        picks.tokens.append((slot, tuple(tokens)))
        return picks
