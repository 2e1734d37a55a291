"""Every answer is computed from its own prompt: the differential harness
(support/differential.py) over the KV layouts, lane counts, residents held and evicted,
the prompt cache's RAM and disk tiers, LoRA adapters, a draft, a grammar and cancelled
requests; and the engine's guard, which checks a sequence's cells against the runtime's
record before a prompt trusts them."""

from __future__ import annotations

import io
import shutil
import threading

import openai
import pytest
from PIL import Image

from fixtures.adapter_files import LoraSpec, write_lora
from engine.catalog.gguf_file import GGUFInspector
from engine.catalog.models import ModelStore
from engine.conversation.images import MARKER, read_image
from engine.engine import Engine
from engine.batching.residency import Residency
from engine.llama.runtime import LlamaModel
from engine.settings import CacheLimits, EngineSettings, LoadSettings
from support.differential import Recorder, check, drive, prompts
from support.engines import GREEDY, api_client, run, settled, start_engine
from support.models import STARTER
from tiny_gguf import write_tiny_model

LOAD = LoadSettings(n_ctx=512, n_batch=64)
CACHE = CacheLimits(ram_bytes=64 << 20, disk_bytes=64 << 20)


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tiny_model):
    folder = tmp_path_factory.mktemp("differential-models")
    shutil.copy(tiny_model, folder / "tiny.gguf")
    write_lora(tiny_model, folder / "style-a.gguf", LoraSpec(layers=(0, 1), seed=1, strength=0.5))
    write_tiny_model(folder / "tiny-draft.gguf", seed=3)  # the same vocabulary, other weights
    return folder


@pytest.fixture
def lab(folder, tmp_path, monkeypatch):
    """(store, make(**settings) -> Engine, recorder, alone(request) on a reference)."""
    store = ModelStore(folder, GGUFInspector())
    recorder = Recorder(monkeypatch)
    engines = []

    def make(**settings):
        settings.setdefault("cache", CACHE)
        settings.setdefault("cache_folder", tmp_path / "prompt-cache")
        engines.append(Engine(store, EngineSettings(LOAD, **settings)))
        return engines[-1]

    reference = Engine(store, EngineSettings(LOAD, parallel=1, kv_layout="unified"))
    yield store, make, recorder, lambda request: recorder.alone(reference, request)
    for engine in [*engines, reference]:
        engine.close()


def differential(lab, seed: int, rounds: int = 4, **settings) -> int:
    store, make, recorder, alone = lab
    engine = make(**settings)
    drive(engine, store.resolve("tiny"), prompts(seed), seed, rounds=rounds)
    engine.close()
    return check(*recorder.take(), alone)


QUICK = [("split", 16, 4), ("split", 4, 4), ("unified", 4, 4)]
# The ways to a prompt's cells each takes (support.differential.Recorder), each taken 8 to
# 15 times in a run (seed 7), timing aside: a split cache of four lanes, every one held,
# serves a shared prefix in place (13) where a sequence is free less often for a copy (3).
TAKEN = {("split", 16, 4): {"copied", "restored", "continued"},
         ("split", 4, 4): {"in place", "restored", "continued"},
         ("unified", 4, 4): {"copied", "restored", "continued"}}
MATRIX = [("split", 1, 4), ("split", 4, 1), ("split", 16, 1), ("unified", 1, 4),
          ("unified", 16, 1), ("unified", 4, 0)]


@pytest.mark.parametrize("layout,lanes,resident", QUICK, ids=lambda v: str(v))
def test_concurrent_answers_are_their_own_prompts(lab, layout, lanes, resident):
    """Waves of concurrent requests sharing long prefixes, continued, cancelled, with
    residents held and evicted to the prompt cache and restored from it."""
    assert differential(lab, seed=7, kv_layout=layout, parallel=lanes, resident=resident) >= 20
    assert TAKEN[layout, lanes, resident] <= set(lab[2].paths), lab[2].paths


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("layout,lanes,resident", MATRIX, ids=lambda v: str(v))
def test_concurrent_answers_are_their_own_prompts_over_the_matrix(lab, layout, lanes, resident,
                                                                  seed):
    assert differential(lab, seed=seed, kv_layout=layout, parallel=lanes,
                        resident=resident) >= 20


@pytest.mark.slow
def test_answers_after_a_restart_from_the_disk_tier_are_their_own(lab):
    store, make, recorder, alone = lab
    texts = prompts(11)
    first = make(resident=1)
    drive(first, store.resolve("tiny"), texts, 11, rounds=3)
    first.close()  # its residents saved to disk
    _, earlier = recorder.take()
    second = make(resident=1)
    drive(second, store.resolve("tiny"), texts, 12, rounds=3)
    seen, held = recorder.take()
    assert any(one.cached for one in seen)  # the disk tier served some
    assert check(seen, [*earlier, *held], alone) >= 10


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["split", "unified"])
def test_answers_under_an_adapter_a_draft_and_a_grammar_are_their_own(lab, layout):
    store, make, recorder, alone = lab
    tiny, texts = store.resolve("tiny"), prompts(5)
    engine = make(kv_layout=layout, parallel=4, resident=2)
    adapted = store.adapter_uses(tiny, [("style-a", 1.0)])
    drive(engine, tiny, texts, 5, rounds=2, adapters=adapted)
    drive(engine, tiny, texts, 6, rounds=2, wave=1, speculation="draft",
          draft_model=store.resolve("tiny-draft"))
    drive(engine, tiny, texts, 7, rounds=2, grammar='root ::= [a-z ]+')
    drive(engine, tiny, texts, 8, rounds=2)
    assert check(*recorder.take(), alone) >= 30


@pytest.mark.slow
def test_answers_with_pictures_are_their_own(vision_dir, tmp_path, monkeypatch):
    """Chats holding one of two pictures (its span shared as a prefix, or not), their
    texts differing in a number after it."""
    store = ModelStore(vision_dir, GGUFInspector())
    recorder = Recorder(monkeypatch)
    settings = dict(cache=CACHE, cache_folder=tmp_path)
    load = LoadSettings(n_ctx=1024, n_batch=256)
    engine = Engine(store, EngineSettings(load, parallel=4, resident=2, **settings))
    reference = Engine(store, EngineSettings(load, parallel=1, kv_layout="unified"))
    pictures = [read_image(_png(color), "image") for color in ((200, 40, 40), (30, 30, 220))]
    texts = [f"{i} Tell me about the number {i}." for i in range(6)]

    def chat(text):
        return {"messages": ({"role": "user", "content": f"{MARKER}{text[2:]}"},),
                "pictures": (pictures[int(text[0]) % 2],)}

    try:
        drive(engine, store.resolve("smolvlm-256m"), texts, 3, rounds=2, wave=6,
              continue_=0, shape=chat)
        engine.close()
        assert check(*recorder.take(), lambda r: recorder.alone(reference, r)) >= 8
        assert recorder.paths["copied"] + recorder.paths["restored"] >= 1
    finally:
        engine.close()
        reference.close()


def _png(color) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (64, 48), color).save(out, "PNG")
    return out.getvalue()


# -- the guard --------------------------------------------------------------------------

def test_a_restore_after_a_queued_stream_copy_holds_the_restored_prompt(lab):
    """The cause of issue 67: llama.cpp copies a split cache's stream at the next decode.
    A prefix copied from one conversation's stream and then a longer prefix restored from
    the prompt cache into the same stream: the copy must not land over the restore."""
    store, make, recorder, alone = lab
    engine = make(kv_layout="split", parallel=16, resident=1)
    tiny, texts = store.resolve("tiny"), prompts(3)
    for text in texts[:2]:  # the first saved to the prompt cache, the second resident
        run(engine, model=tiny, prompt=text, sampling=GREEDY, max_tokens=4, ignore_eos=True)
    started = run(engine, model=tiny, prompt=texts[0], sampling=GREEDY, max_tokens=4,
                  ignore_eos=True)[0]
    assert started.cached_tokens == len(recorder.seen[-1].prompt) - 1  # restored whole
    assert settled(engine)["kv_mismatches"] == 0
    assert check(*recorder.take(), alone) == 3


def test_the_harness_sees_the_bug_put_back(lab, monkeypatch):
    """Without the settling of queued copies and without the guard, the harness fails:
    it is not vacuous."""
    monkeypatch.setattr(LlamaModel, "settle_copies", lambda self: None)
    monkeypatch.setattr(Residency, "verify", lambda self, slot: None)
    with pytest.raises(AssertionError, match="not computed from its own prompt"):
        differential(lab, seed=7, kv_layout="split", parallel=16, resident=4)


def test_the_guard_cuts_a_sequence_back_to_what_its_cells_truly_hold(lab, monkeypatch):
    """With the runtime's settling of queued copies taken out (the bug put back), the
    guard sees the record disagree and the answer is still right; the mismatch is
    counted in /health and /metrics."""
    monkeypatch.setattr(LlamaModel, "settle_copies", lambda self: None)
    store, make, recorder, alone = lab
    engine = make(kv_layout="split", parallel=16, resident=1)
    tiny, texts = store.resolve("tiny"), prompts(3)
    for text in texts[:2]:
        run(engine, model=tiny, prompt=text, sampling=GREEDY, max_tokens=4, ignore_eos=True)
    run(engine, model=tiny, prompt=texts[0], sampling=GREEDY, max_tokens=4, ignore_eos=True)
    assert check(*recorder.take(), alone) == 3
    assert settled(engine)["kv_mismatches"] == 1


# -- the reproduction of issue 67, with the starter -----------------------------------

NUMBERS = [f"Write one sentence about the number {i}." for i in range(8)]


def about_their_numbers(answers: list[str]) -> None:
    """Each answer names its own number, and no other prompt's."""
    for i, answer in enumerate(answers):
        named = {n for n in range(8) if f"number {n}" in answer}
        assert named == {i}, (i, answer)


def ask_solo_then_together(ask) -> list[tuple[str, int]]:
    """The eight questions one after another, then all at once: (answer, cached) each."""
    about_their_numbers([ask(q)[0] for q in NUMBERS])
    together: list = [None] * len(NUMBERS)

    def one(i):
        together[i] = ask(NUMBERS[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(NUMBERS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    about_their_numbers([answer for answer, _ in together])
    return together


def test_eight_concurrent_answers_through_the_api_with_the_defaults(home):
    """Issue 67 as it was found: `homerack serve` with every setting at its default (the
    split layout chosen), the response cache off, the official openai client."""
    process, address, _ = start_engine(home, "differential", ["--model", STARTER])
    try:
        client = openai.OpenAI(base_url=f"{address.url}/v1", api_key=address.token,
                               max_retries=0)

        def ask(question):
            reply = client.chat.completions.create(
                model=STARTER, messages=[{"role": "user", "content": question}],
                temperature=0, max_tokens=10)
            usage = reply.usage
            return reply.choices[0].message.content, \
                (usage.prompt_tokens_details.cached_tokens, usage.prompt_tokens)

        together = ask_solo_then_together(ask)
        # the last prompt token is always evaluated (its logits are sampled)
        assert all(cached < prompt for _, (cached, prompt) in together)
        with api_client(address) as http:
            batching = http.get("/health").json()["batching"]
        assert batching["kv_layout"] == "split" and batching["parallel"] == 16
        assert batching["kv_mismatches"] == 0
    finally:
        process.stop()


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["split", "unified"])
@pytest.mark.parametrize("lanes", [1, 4, 16])
def test_eight_concurrent_answers_over_layouts_and_lanes(starters_dir, layout, lanes):
    store = ModelStore(starters_dir, GGUFInspector())
    engine = Engine(store, EngineSettings(LoadSettings(n_ctx=2048), kv_layout=layout,
                                          parallel=lanes,
                                          cache=CACHE))
    try:
        def ask(question):
            started, text, _ = run(engine, model=store.resolve(STARTER), sampling=GREEDY,
                                   max_tokens=10,
                                   messages=({"role": "user", "content": question},))
            return text, started.cached_tokens

        ask_solo_then_together(ask)
        assert settled(engine)["kv_mismatches"] == 0
    finally:
        engine.close()
