"""The differential harness: every answer is computed from its own prompt.

Each request's first-token logits, as an engine computed them under load (seeded random
waves of concurrent requests whose prompts share long prefixes and differ in one token at
the start, in the middle or at the end; continued conversations, residents held and
evicted, prefixes copied between streams or served in place, states restored from the
prompt cache, requests cancelled mid-prompt), against the same request evaluated alone
in an empty sequence by a reference engine (one lane, no prompt cache, nothing resident).

A mix-up between two prompts moves the logits by whole units; llama.cpp rounds a row
batched with others a little differently from the same row alone. Measured on the tiny
model over both layouts, 1/4/16 lanes and three seeds (82 first picks each): a right
answer at most 0.021 from its reference (the split layout 0.005, a unified pool more: its
attention spans every sequence's cells), two of these prompts at least 0.42 apart
(median 6), and with the bug of issue 67 put back 16-26 of 82 picks 0.5-5.9 off. So
TOLERANCE sits between the two. Each check also bounds `cached_tokens` by the longest prefix the prompt
truly shares with a sequence the engine had evaluated before.

The prompts are words the tiny model's vocabulary spells, and their variants carry a
number, so a greedy answer copying it would show a mix-up in text too; the logits show
it whatever the model says.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from engine.batching.residency import SEAM, Residency
from engine.batching.scheduler import Scheduler
from engine.batching.run import Runner
from engine.events import Failed, Finished, GenerationRequest
from engine.llama.runtime import LlamaModel
from engine.prefix import common_prefix

from .engines import GREEDY, Collector

TOLERANCE = 0.1  # max |logit difference|: a right answer <= 0.021, two prompts >= 0.42
WORDS = ("the cat is on the mat and the dog is on the mat so the cat sat on the dog "
         "and the mat sat on the cat").split()


@dataclass
class Seen:
    """A request's first pick as the engine made it."""
    request: GenerationRequest
    prompt: list[int]
    logits: np.ndarray
    cached: int


class Recorder:
    """The first-token logits of every request an engine in this process admits, and
    every token list its sequences held when their requests ended (what a later prompt
    may truly share). `take()` hands over what was recorded and starts afresh."""

    def __init__(self, monkeypatch):
        self.seen: list[Seen] = []
        self.held: list[list[int]] = []
        self._lock = threading.Lock()
        sample, finish, recorder = Runner._sample, Scheduler._finish, self

        def recorded_sample(runner, asked, picks):
            llama = runner.host.loaded.llama
            for slot, end in asked:
                if slot.output.produced == 0:
                    seen = Seen(slot.job.request, list(slot.prompt),
                                np.array(llama.logits(end), copy=True), slot.n_cached)
                    with recorder._lock:
                        recorder.seen.append(seen)
            sample(runner, asked, picks)

        def recorded_finish(scheduler, slot):
            with recorder._lock:
                recorder.held.append(list(slot.tokens))
            finish(scheduler, slot)

        monkeypatch.setattr(Runner, "_sample", recorded_sample)
        monkeypatch.setattr(Scheduler, "_finish", recorded_finish)
        self.paths: Counter[str] = Counter()  # which ways to a prompt's cells were taken
        slot_for, copy, restore = Residency.slot_for, LlamaModel.copy_prefix, LlamaModel.restore

        def counted_slot_for(residency, source, keep):
            slot = slot_for(residency, source, keep)
            if slot is not source or not keep:
                self.paths["new sequence"] += 1
            else:  # a conversation continued, or one that left serving a shared prefix
                self.paths["continued" if len(slot.tokens) - keep <= SEAM else "in place"] += 1
            return slot

        def counted_copy(llama, src, dst, n):
            self.paths["copied"] += 1
            copy(llama, src, dst, n)

        def counted_restore(llama, seq_id, state, tokens):
            restored = restore(llama, seq_id, state, tokens)
            self.paths["restored"] += restored
            return restored

        monkeypatch.setattr(Residency, "slot_for", counted_slot_for)
        monkeypatch.setattr(LlamaModel, "copy_prefix", counted_copy)
        monkeypatch.setattr(LlamaModel, "restore", counted_restore)

    def take(self) -> tuple[list[Seen], list[list[int]]]:
        with self._lock:
            taken = self.seen, self.held
            self.seen, self.held = [], []
        return taken

    def alone(self, engine, request: GenerationRequest) -> tuple[list[int], np.ndarray]:
        """The request evaluated alone by a reference engine (one lane, no prompt cache,
        nothing resident): its prompt tokens and first logits."""
        self.take()
        collector = Collector()
        engine.submit(replace(request, cache_prompt=False, max_tokens=1), collector)
        _, _, done = collector.result(timeout=120)
        assert isinstance(done, Finished), done
        (seen,), _ = self.take()
        return seen.prompt, seen.logits


def prompts(seed: int, count: int = 12, length: int = 24) -> list[str]:
    """Prompts sharing a long prefix, each differing from a base in one word: at the end,
    in the middle or at the start (a number where the base has a word)."""
    rng = random.Random(seed)
    base = [rng.choice(WORDS) for _ in range(length)]
    out = []
    for i in range(count):
        words = list(base)
        at = (len(words) - 1, len(words) // 2, 0)[i % 3]
        words[at] = str(i)
        out.append(" ".join(words))
    return out


def drive(engine, model, texts: list[str], seed: int, rounds: int = 4, wave: int = 8,
          tokens: int = 6, cancel: float = 0.15, continue_: float = 0.25,
          shape=lambda text: {"prompt": text}, **request) -> list[str]:
    """Seeded random waves of concurrent requests over `texts`: some continue an earlier
    answer (its prompt extended), some are cancelled while their prompt is evaluated.
    `shape` makes a text the request's prompt (or a chat with pictures). Returns every
    text asked."""
    rng = random.Random(seed)
    answered: list[str] = []
    asked: list[str] = []
    for _ in range(rounds):
        jobs = []
        for _ in range(wave):
            if answered and rng.random() < continue_:
                prompt = rng.choice(answered) + " " + rng.choice(WORDS)
            else:
                prompt = rng.choice(texts)
            asked.append(prompt)
            collector = Collector()
            job = engine.submit(GenerationRequest(
                model=model, sampling=GREEDY, max_tokens=tokens, ignore_eos=True,
                **shape(prompt), **request), collector)
            if rng.random() < cancel:  # before its admission, or while its prompt is read
                threading.Timer(rng.random() * 0.02, job.cancel).start()
            else:
                jobs.append((prompt, collector))
            time.sleep(rng.random() * 0.01)
        for prompt, collector in jobs:
            _, text, done = collector.result(timeout=120)
            assert isinstance(done, (Finished, Failed)), done
            if isinstance(done, Finished):
                answered.append(prompt + text)
    return asked


def check(seen: list[Seen], held: list[list[int]], alone) -> int:
    """Each recorded first pick against `alone(request)` (Recorder.alone on a reference
    engine); returns how many were checked. `held`: the token lists the engine's
    sequences held (with an engine before it, whose prompt cache it read, its too)."""
    assert seen, "no request reached its first token"
    reference: dict = {}
    for one in seen:
        key = (tuple(one.prompt), one.request.adapter_set)  # the same tokens under other weights
        if key not in reference:
            reference[key] = alone(one.request)
        prompt, logits = reference[key]
        assert prompt == one.prompt, "the reference tokenized the request otherwise"
        diff = float(np.max(np.abs(logits - one.logits)))
        assert diff <= TOLERANCE, (
            f"an answer not computed from its own prompt: its first logits differ by {diff:.3f} "
            f"from the prompt's evaluated alone (cached {one.cached} of {len(one.prompt)})")
        shared = max((common_prefix(one.prompt, tokens) for tokens in held), default=0)
        assert one.cached <= min(shared, len(one.prompt) - 1), (one.cached, shared)
    return len(seen)
