"""A batching step planned, purely (`schedule`): which adapter set runs (`take_turn`),
and either a draft round for a lone speculating sequence or which tokens and prompt
chunks go into which llama_decode calls (`plan_batch`). run.py carries a plan out and the
scheduler applies its picks; nothing here touches llama.cpp."""

from __future__ import annotations

from dataclasses import dataclass

from ..llama.runtime import Chunk
from .slot import Slot

PREFILL_SHARE = 64  # prompt tokens per step while other sequences decode (SmolLM2: ~0.3 s)
# The same for each waiting prompt when prompts share the decoding tokens' call (the
# default): a call reads the weights whatever it holds, so many prompts arriving at once
# fill it (16 clients with 300-token prompts: 0.71x of llama-server at 128 a step in all,
# 0.84x at 512), while one long prompt still comes in steps the running streams outlast.
MIXED_SHARE = 128
# Steps an adapter set keeps the context while others wait: the first evaluation after a
# switch rebuilds llama.cpp's graph (measured: +5 ms on a 10 ms SmolLM2 step).
ADAPTER_TURN = 4


@dataclass(frozen=True)
class Plan:
    """One step: the adapter set it runs under, its sequences, and what they evaluate."""
    adapters: tuple          # the LoRA adapter set applied to the context
    slots: list[Slot]        # the sequences under that set
    calls: list[list[Chunk]]  # the llama_decode calls, in order (none for a draft round)
    draft: Slot | None = None  # a lone speculating sequence: one draft round instead
    turn: int = 1            # steps in a row this adapter set has run, this one included


def schedule(active: list[Slot], last: tuple, run: int, n_batch: int,
             invariant: bool) -> Plan | None:
    """The next step of the active sequences (`last`: the adapter set of the previous
    `run` steps); None when no sequence is active. A lone decoding sequence with a drafter
    drafts, unless its controller measured plain steps faster; otherwise one batch."""
    adapters, slots, turn = take_turn(active, last, run)
    if not slots:
        return None
    lone = slots[0] if len(slots) == 1 and slots[0].decoding else None
    if lone and lone.spec and not lone.spec.controller.wants_plain():
        return Plan(adapters, slots, [], lone, turn)
    return Plan(adapters, slots, plan_batch(slots, n_batch, invariant=invariant), None, turn)


def plan_batch(slots: list[Slot], n_batch: int, prefill_share: int = PREFILL_SHARE,
               invariant: bool = False) -> list[list[Chunk]]:
    """The next step's evaluations, in order.

    By default, as llama.cpp's server does, one batch: a token of every decoding slot and
    prompt chunks, oldest request first, up to n_batch tokens; one llama_decode reads the
    weights once for all (sixteen prompts arriving together took sixteen calls, 0.83x of
    llama-server end to end).

    `invariant` (serve --batch-invariant): the decoding tokens in a batch of their own,
    then a batch for each prompt chunk, capped at `prefill_share` tokens while others
    decode. llama.cpp rounds a sequence's logits alike in company and alone only while
    the batch takes the same kernels (flash attention's sequential pass, for fewer than
    64 rows; matrix kernels that do not switch with the row count): greedy answers then
    match solo ones (see docs/batching.md). Images go in calls of their own either way."""
    tokens = [Chunk(s.seq_id, len(s.tokens), (s.last,), True) for s in slots if s.decoding]
    if not invariant:
        return _mixed(tokens, slots, n_batch, MIXED_SHARE)
    room = min(n_batch - len(tokens), prefill_share) if tokens else n_batch
    calls = [_in_sequence_order(tokens)] if tokens else []
    full = room
    for slot in _waiting(slots):
        if room <= 0:
            break
        chunk = _prompt_chunk(slot, room)
        if chunk.image is not None:  # in a call of its own, when the step has its share left
            if room == full:
                calls.append([chunk])
            break
        calls.append([chunk])
        room -= len(chunk.tokens)
    return calls


def _mixed(tokens: list[Chunk], slots: list[Slot], n_batch: int,
           share: int) -> list[list[Chunk]]:
    """The decoding tokens and prompt chunks in one call, up to n_batch tokens; while
    others decode, `share` prompt tokens for each waiting prompt (one long prompt joining
    running streams comes in steps short enough for them to keep flowing; sixteen
    arriving together fill the call). A prompt that reaches an image stops there, and
    the image goes alone when the call is empty."""
    call, waiting = list(tokens), _waiting(slots)
    room = min(n_batch - len(tokens), share * len(waiting)) if tokens else n_batch
    for slot in waiting:
        if room <= 0:
            break
        chunk = _prompt_chunk(slot, room)
        if chunk.image is not None:
            if not call:
                return [[chunk]]
            continue
        call.append(chunk)
        room -= len(chunk.tokens)
    return [_in_sequence_order(call)] if call else []


def _in_sequence_order(call: list[Chunk]) -> list[Chunk]:
    """A call's chunks by sequence id, whatever order the slots are in: llama.cpp
    evaluates a split cache's streams in runs of consecutive ids, a pass over the weights
    for each run (out of order, 16 streams took several passes a step, each building its
    graph again: 16 short streams at 0.79x of llama-server, 0.90x in order)."""
    return sorted(call, key=lambda chunk: chunk.seq_id)


def _waiting(slots: list[Slot]) -> list[Slot]:
    """The slots whose prompts are still being evaluated, oldest request first; while a
    prompt with precedence (the owner's) waits, only those: a device's long prompt then
    takes no part of the step (the owner's first token waited 41.8 s behind devices'
    prompt chunks, 0.14 s alone)."""
    waiting = sorted((s for s in slots if s.prefilling), key=lambda s: s.admitted)
    first = [s for s in waiting if s.precedence]
    return first or waiting


def _prompt_chunk(slot: Slot, room: int) -> Chunk:
    """The slot's next prompt chunk: a whole image when one starts here, else text up to
    `room` tokens and the next image (the last token's logits asked for)."""
    start, rest = len(slot.tokens), slot.pending()
    image = slot.images.get(start)
    if image is not None:
        return Chunk(slot.seq_id, start, tuple(rest[:image.n_pos]), False, image)
    upto = min((at - start for at in slot.images if at > start), default=len(rest))
    take = rest[:min(room, upto)]
    return Chunk(slot.seq_id, start, tuple(take), len(take) == len(rest))


def take_turn(active: list[Slot], last: tuple, run: int) -> tuple[tuple, list[Slot], int]:
    """The adapter set this step runs, its slots, and how many steps in a row it has run.
    An adapter applies to the whole context, so each set present gets steps of its own:
    `last` (which ran the previous `run` steps) keeps the context for ADAPTER_TURN steps,
    then the next set takes it. Slots under the same set batch together."""
    sets = sorted({slot.adapters for slot in active})
    if not sets:
        return last, [], 0
    if last in sets and (len(sets) == 1 or run < ADAPTER_TURN):
        chosen = last
    else:
        chosen = next((s for s in sets if s > last), sets[0])
    return chosen, [s for s in active if s.adapters == chosen], run + 1 if chosen == last else 1
