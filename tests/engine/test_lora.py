"""LoRA adapters on real llama.cpp, over the tiny F32 model: the adapter's effect equals
the weights merged in numpy, requests under different adapters run side by side and
each equals its solo answer, caches never mix adapters, bad adapters fail alone."""

from __future__ import annotations

import shutil
import threading
from dataclasses import replace

import numpy as np
import pytest

from fixtures.adapter_files import LoraSpec, merged, write_lora
from engine.catalog.gguf_file import GGUFInspector
from engine.catalog.models import ModelStore
from engine.engine import Engine
from engine.settings import CacheLimits, EngineSettings, LoadSettings
from engine.errors import InvalidModelFile, InvalidRequest, ModelNotFound
from engine.events import Finished
from support.engines import GREEDY, Collector, run
from tiny_gguf import write_tiny_model

SPEC_A = LoraSpec(layers=(0, 1), seed=1, strength=0.5)
SPEC_B = LoraSpec(targets=("attn_v", "ffn_down"), layers=(0, 1), seed=2, strength=0.5)
PROMPT = "the cat is on the mat and the dog is on the mat " * 3


@pytest.fixture(scope="module")
def folder(tmp_path_factory, tiny_model):
    folder = tmp_path_factory.mktemp("lora-models")
    shutil.copy(tiny_model, folder / "tiny.gguf")
    write_lora(tiny_model, folder / "style-a.gguf", SPEC_A)
    write_lora(tiny_model, folder / "style-b.gguf", SPEC_B)
    # the same architecture, another size: refused before llama.cpp sees it
    wide = write_tiny_model(folder.parent / "wide.gguf", n_embd=128, n_ff=256)
    write_lora(wide, folder / "wide-style.gguf", SPEC_A)
    return folder


@pytest.fixture
def store(folder):
    return ModelStore(folder, GGUFInspector())


@pytest.fixture
def engine(store, tmp_path):
    engine = Engine(store, EngineSettings(
        LoadSettings(n_ctx=512, n_batch=64), resident=1,
        cache=CacheLimits(ram_bytes=64 << 20, disk_bytes=64 << 20), cache_folder=tmp_path))
    yield engine
    engine.close()


def _with(store, *uses):
    return store.adapter_uses(store.resolve("tiny"), list(uses))


def _answer(engine, store, *uses, prompt=PROMPT, tokens=16, cache_prompt=True):
    started, text, done = run(engine, model=store.resolve("tiny"), prompt=prompt,
                              max_tokens=tokens, sampling=GREEDY, adapters=_with(store, *uses),
                              cache_prompt=cache_prompt)
    assert isinstance(done, Finished), done
    return started, text, done


def _logits(path, adapter=None, scale=1.0):
    from engine.llama.runtime import LlamaModel
    from engine.model.adapters import AdapterBank
    from engine.catalog.models import AdapterUse, LocalModel

    llama = LlamaModel(path, LoadSettings(n_ctx=128, n_batch=64, repack=False))
    try:
        if adapter is not None:
            bank = AdapterBank(llama)
            use = AdapterUse(LocalModel(adapter.stem, adapter, 0, False), scale)
            bank.ready((use,))
            bank.apply(((str(adapter), scale),))
        tokens = llama.tokenize("the cat is on the mat", add_special=True, parse_special=True)
        llama.decode(tokens, 0)
        return llama.logits().copy()
    finally:
        llama.close()


@pytest.mark.parametrize("scale", [0.7, -0.4])
def test_the_adapter_equals_its_weights_merged_in_numpy(folder, tmp_path, scale):
    base = folder / "tiny.gguf"
    plain = _logits(base)
    adapted = _logits(base, folder / "style-a.gguf", scale)
    reference = _logits(merged(base, SPEC_A, scale, tmp_path / "merged.gguf"))
    effect = np.abs(adapted - plain).max()
    assert effect > 1e-2  # the adapter changes the logits...
    np.testing.assert_allclose(adapted, reference, rtol=0, atol=effect * 1e-3)  # ...exactly so


def test_scale_zero_is_the_base_model(folder, store):
    base = folder / "tiny.gguf"
    assert np.array_equal(_logits(base, folder / "style-a.gguf", 0.0), _logits(base))
    assert _with(store, ("style-a", 0.0)) == ()  # and a request drops such a use


def test_adapters_answer_differently_and_each_equals_its_solo_answer_in_company(engine, store):
    """Every prompt evaluated afresh (a cached prefix rounds differently, and the tiny
    random model's margins are small): then each set's steps are its own, computed as
    when it runs alone."""
    sets = (("a", (("style-a", 1.0),)), ("b", (("style-b", 1.0),)), ("base", ()))
    solo = {name: _answer(engine, store, *uses, cache_prompt=False)[1] for name, uses in sets}
    assert len(set(solo.values())) == 3
    collectors = {}
    for name, uses in sets:
        collectors[name] = Collector()
        engine.submit(replace(_request(store, uses), cache_prompt=False), collectors[name])
    together = {name: c.result() for name, c in collectors.items()}
    again = solo
    for name, (started, text, done) in together.items():
        assert isinstance(done, Finished), done
        assert text == again[name], name
    assert together["a"][0].model == "tiny+style-a"
    assert together["a"][0].adapters == ({"id": "style-a", "scale": 1.0},)
    status = engine.status()["adapters"]
    assert status["loaded"] == ["style-a", "style-b"] and status["switches"] >= 4


def _request(store, uses, prompt=PROMPT):
    from engine.events import GenerationRequest

    return GenerationRequest(model=store.resolve("tiny"), prompt=prompt, max_tokens=16,
                             sampling=GREEDY, adapters=_with(store, *uses))


def test_no_kv_state_is_reused_under_another_adapter(engine, store):
    first = _answer(engine, store, ("style-a", 1.0))
    resident = _answer(engine, store, ("style-a", 1.0))
    assert resident[2].usage.cached_tokens > 0 and resident[1] == first[1]
    other = _answer(engine, store, ("style-b", 1.0))  # the same prompt: A's cells unused
    assert other[2].usage.cached_tokens == 0
    scaled = _answer(engine, store, ("style-a", 0.5))  # a scale is another set
    assert scaled[2].usage.cached_tokens == 0
    # the prompt cache's tiers hold the states saved above, each under its own adapters
    plain = _answer(engine, store)
    assert plain[2].usage.cached_tokens == 0
    engine.fleet.main.host.loaded.cache.flush()
    assert _answer(engine, store, ("style-b", 1.0))[1] == other[1]
    assert _answer(engine, store)[1] == plain[1]


def test_bad_adapters_are_refused_in_words_and_the_model_serves_on(engine, store, folder):
    with pytest.raises(ModelNotFound, match="adapter 'nope' not found.*style-a"):
        _with(store, ("nope", 1.0))
    with pytest.raises(InvalidRequest, match="wide-style does not fit model tiny:.*128"):
        _with(store, ("wide-style", 1.0))
    with pytest.raises(InvalidRequest, match="outside"):
        _with(store, ("style-a", 9.0))
    with pytest.raises(InvalidRequest, match="a model, not a LoRA adapter"):
        _with(store, ("tiny", 1.0))
    with pytest.raises(InvalidRequest, match="named twice"):
        _with(store, ("style-a", 1.0), ("style-a", 0.5))
    # a tensor type llama.cpp would crash on: refused when read, as is a truncated file
    from gguf import GGUFWriter

    writer = GGUFWriter(str(folder / "f64.gguf"), "llama")
    writer.add_type("adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_tensor("blk.0.attn_q.weight.lora_a", np.zeros((4, 64)))
    writer.add_tensor("blk.0.attn_q.weight.lora_b", np.zeros((64, 4), np.float32))
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(InvalidModelFile, match="F64"):
        _with(store, ("f64", 1.0))
    data = (folder / "style-a.gguf").read_bytes()
    (folder / "cut.gguf").write_bytes(data[:len(data) // 2])
    with pytest.raises(InvalidModelFile, match="truncated"):
        _with(store, ("cut", 1.0))
    assert _answer(engine, store, ("style-a", 1.0))[1]


def test_draft_speculation_stays_off_under_an_adapter(engine, store):
    request = replace(_request(store, (("style-a", 1.0),)), speculation="draft",
                      draft_model=store.resolve("tiny"))
    collector = Collector()
    engine.submit(request, collector)
    started, text, done = collector.result()
    assert isinstance(done, Finished) and done.usage.speculative is None
    assert any("draft speculation is off" in note for note in started.notes)


def test_an_adapter_is_no_model_to_load(engine, store):
    started, _, failed = run(engine, model=store.resolve("style-a"), prompt="hi", max_tokens=2)
    assert "is a LoRA adapter, not a model" in failed.error.message


def test_the_store_lists_adapters_under_their_base(store):
    kinds = {m.id: store.kind_of(m) for m in store.list()}
    assert kinds["style-a"] == "adapter" and kinds["tiny"] == "chat"
    assert [m.id for m in store.bases_for(store.resolve("style-a"))] == ["tiny"]
    assert store.bases_for(store.resolve("wide-style")) == []


def test_switching_adapters_from_many_threads_keeps_every_answer(engine, store):
    expected = {name: _answer(engine, store, *uses)[1] for name, uses in
                (("a", (("style-a", 1.0),)), ("b", (("style-b", 1.0),)))}
    results, threads = [], []
    for i in range(6):
        name = "ab"[i % 2]
        uses = (("style-a", 1.0),) if name == "a" else (("style-b", 1.0),)
        threads.append(threading.Thread(
            target=lambda n=name, u=uses: results.append((n, _answer(engine, store, *u)[1]))))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(results) == sorted((n, expected[n]) for n, _ in results) and len(results) == 6


def test_each_adapter_set_gets_steps_of_its_own_in_turn():
    from engine.batching.plan import ADAPTER_TURN, take_turn
    from engine.batching.slot import Slot

    a, b = (("a.gguf", 1.0),), (("b.gguf", 0.5),)
    slots = [Slot(0, adapters=a), Slot(1, adapters=()), Slot(2, adapters=a), Slot(3, adapters=b)]
    turns, last, run = [], (), 0
    for _ in range(3 * ADAPTER_TURN + 1):
        last, chosen, run = take_turn(slots, last, run)
        turns.append((last, [s.seq_id for s in chosen]))
    expected = [((), [1])] * ADAPTER_TURN + [(a, [0, 2])] * ADAPTER_TURN + \
        [(b, [3])] * ADAPTER_TURN + [((), [1])]
    assert turns == expected
    alone = [slots[0]]
    assert take_turn(alone, b, 1) == (a, alone, 1)  # the set present runs at once
    assert take_turn(alone, a, 99) == (a, alone, 100)  # and keeps running while alone
    assert take_turn([], a, 3) == (a, [], 0)


def test_a_replaced_adapter_file_is_loaded_again(folder, store, engine, tmp_path):
    before = _answer(engine, store, ("style-a", 1.0))[1]
    path = folder / "style-a.gguf"
    write_lora(folder / "tiny.gguf", tmp_path / "new.gguf", SPEC_B)
    shutil.copy(tmp_path / "new.gguf", path)  # the same name, another adapter
    try:
        after = _answer(engine, store, ("style-a", 1.0))[1]
        assert after != before
        assert after == _answer(engine, store, ("style-b", 1.0))[1]
    finally:
        write_lora(folder / "tiny.gguf", path, SPEC_A)


def test_adapters_beyond_the_bound_are_freed_least_recently_used_first(engine, store,
                                                                       monkeypatch):
    """Requests may name every adapter of the folder in turn: the model keeps a few, and
    one freed comes back with the same answer when named again."""
    monkeypatch.setattr("engine.model.adapters.MAX_HELD", 1)
    first = _answer(engine, store, ("style-a", 1.0), cache_prompt=False)[1]
    _answer(engine, store, ("style-b", 1.0), cache_prompt=False)
    assert engine.fleet.main.host.loaded.adapters.loaded() == ["style-b"]
    assert _answer(engine, store, ("style-a", 1.0), cache_prompt=False)[1] == first
    assert engine.fleet.main.host.loaded.adapters.loaded() == ["style-a"]


def test_tokenizers_kept_for_counting_are_bounded(store, folder, monkeypatch):
    monkeypatch.setattr("engine.model.vocabularies.MAX_VOCABS", 1)
    engine = Engine(store, EngineSettings(LoadSettings(n_ctx=256)))
    try:
        shutil.copy(folder / "tiny.gguf", folder / "tiny-copy.gguf")
        counts = [engine.tokenize(store.resolve(name), "the cat sat") for name in
                  ("tiny", "tiny-copy", "tiny")]
        assert counts[0] == counts[1] == counts[2] and len(engine.vocabularies) == 1
    finally:
        engine.close()
        (folder / "tiny-copy.gguf").unlink()
