"""Several models in one engine (engine/fleet.py), on copies of the tiny random model: a
request naming a model loads it beside the default one, requests for a model being
loaded share its one load, the least recently used idle model makes room and is found
again in the prompt cache, pinned models stay, idle ones go after their time to live,
and each model loads with its own preset whoever loads it."""

import shutil
import threading
import time

import pytest

from support.engines import GREEDY, Collector, run
from engine.engine import Engine
from engine.settings import CacheLimits, EngineSettings, LoadSettings
from engine.errors import InvalidModelFile, ModelUnloaded
from engine.events import Delta, Failed, Finished, GenerationRequest
from engine.model.host import ModelHost
from engine.presets import Keep, LoadOverride, Presets

LOAD = LoadSettings(n_ctx=256, n_batch=64)


@pytest.fixture
def models(tiny_store):
    """Three models: the tiny one and two copies under other names (other files)."""
    for name in ("second", "third"):
        shutil.copy(tiny_store.folder / "tiny.gguf", tiny_store.folder / f"{name}.gguf")
    return [tiny_store.resolve(name) for name in ("tiny", "second", "third")]


def engine_with(store, **settings) -> Engine:
    return Engine(store, EngineSettings(LOAD, **settings))


def ask(engine, model, prompt="the cat sat on the", tokens=4):
    started, text, end = run(engine, model=model, prompt=prompt, max_tokens=tokens,
                             sampling=GREEDY)
    assert isinstance(end, Finished), end
    return end


def held(engine) -> dict:
    return {entry["id"]: entry for entry in engine.status()["models"]}


def wait_for(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_request_naming_another_model_loads_it_beside_the_default(tiny_store, models):
    tiny, second, _ = models
    engine = engine_with(tiny_store)
    try:
        engine.preload(tiny)
        ask(engine, tiny)
        ask(engine, second)
        ask(engine, tiny)  # still loaded: no swap back
        loaded = held(engine)
        assert set(loaded) == {"tiny", "second"}
        assert loaded["tiny"]["default"] and not loaded["second"]["default"]
        assert loaded["tiny"]["loads"] == loaded["second"]["loads"] == 1
        assert loaded["tiny"]["ttl_s"] is None and loaded["second"]["ttl_s"] == 900
        assert engine.status()["model"] == "tiny"
    finally:
        engine.close()


def test_requests_for_a_model_being_loaded_share_its_one_load(tiny_store, models):
    tiny, second, _ = models
    engine = engine_with(tiny_store)
    try:
        ask(engine, tiny)
        collectors = [Collector() for _ in range(8)]
        threads = [threading.Thread(target=engine.submit, args=(GenerationRequest(
            model=second, prompt=f"request {i}", max_tokens=3, sampling=GREEDY), c))
            for i, c in enumerate(collectors)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert all(isinstance(c.result()[2], Finished) for c in collectors)
        assert held(engine)["second"]["loads"] == 1
        assert len(engine.fleet.lanes()) == 2
    finally:
        engine.close()


def test_the_least_recently_used_idle_model_makes_room_and_its_conversation_returns(
        tiny_store, models, tmp_path):
    tiny, second, third = models
    engine = engine_with(tiny_store, max_models=2, cache=CacheLimits(64 << 20, 64 << 20),
                         cache_folder=tmp_path / "kv")
    prompt = "a conversation worth keeping " * 8
    try:
        ask(engine, tiny)
        first = ask(engine, second, prompt)
        ask(engine, third)  # no room for three: second, not the default, goes
        wait_for(lambda: set(held(engine)) == {"tiny", "third"})
        back = ask(engine, second, prompt + "and more")
        assert first.usage.cached_tokens == 0
        assert back.usage.cached_tokens >= 32, back.usage  # from the prompt cache's disk tier
        assert set(held(engine)) == {"tiny", "second"}  # third was then the idle one
    finally:
        engine.close()


def one_model_bytes(store, model) -> int:
    probe = engine_with(store)
    try:
        return probe.plan_for(model).uses[0].total
    finally:
        probe.close()


def test_memory_decides_what_loads_beside_what(tiny_store, models):
    tiny, second, third = models
    engine = engine_with(tiny_store, ram_budget=int(one_model_bytes(tiny_store, tiny) * 2.6))
    try:
        ask(engine, tiny)
        ask(engine, second)
        assert set(held(engine)) == {"tiny", "second"}  # room for two
        ask(engine, third)
        wait_for(lambda: set(held(engine)) == {"tiny", "third"})
    finally:
        engine.close()


def test_with_room_for_one_the_model_swaps_and_its_conversation_returns_from_disk(
        tiny_store, models, tmp_path):
    tiny, second, _ = models
    engine = engine_with(tiny_store, ram_budget=int(one_model_bytes(tiny_store, tiny) * 1.6),
                         cache=CacheLimits(64 << 20, 64 << 20), cache_folder=tmp_path / "kv")
    prompt = "a conversation worth keeping " * 8
    try:
        ask(engine, tiny, prompt)
        ask(engine, second)
        assert set(held(engine)) == {"second"}  # swapped: no room beside
        back = ask(engine, tiny, prompt + "and more")
        assert set(held(engine)) == {"tiny"}
        assert back.usage.cached_tokens >= 32, back.usage  # restored from the disk tier
        assert engine.status()["prompt_cache"]["hits_disk"] >= 1
    finally:
        engine.close()


def test_a_pinned_model_stays_and_the_default_one_swaps_instead(tiny_store, models):
    tiny, second, third = models
    engine = engine_with(tiny_store, max_models=2)
    engine.presets.set("second", keep=Keep(pinned=True))
    try:
        ask(engine, tiny)
        ask(engine, second)
        ask(engine, third)
        wait_for(lambda: set(held(engine)) == {"second", "third"})
        assert held(engine)["second"]["pinned"]
    finally:
        engine.close()


def test_an_idle_model_is_unloaded_after_its_time_to_live(tiny_store, models):
    tiny, second, _ = models
    engine = engine_with(tiny_store, jit_ttl_s=0.5)
    try:
        ask(engine, tiny)
        ask(engine, second)
        wait_for(lambda: set(held(engine)) == {"tiny"})  # the default one stays
        ask(engine, second)  # loaded again on demand
        assert "second" in held(engine)
    finally:
        engine.close()


def test_a_model_whose_first_load_is_still_probing_is_not_reaped(tiny_store, models,
                                                                 monkeypatch):
    """A lane beside the default one that holds nothing is retired (its load failed), but
    not while its first request is probing the machine before the load begins: the
    request is still in line, the lane busy. (The lane used to look idle then, and a slow
    probe let the reaper retire it: the model answered and was unloaded at once.)"""
    tiny, second, _ = models
    probe = ModelHost._probe

    def slow_probe(host, *args, **kwargs):
        time.sleep(0.25)  # five of the reaper's looks
        return probe(host, *args, **kwargs)

    monkeypatch.setattr("engine.fleet.REAP_S", 0.05)
    monkeypatch.setattr(ModelHost, "_probe", slow_probe)
    engine = engine_with(tiny_store)
    try:
        ask(engine, tiny)
        ask(engine, second)
        time.sleep(0.15)  # the reaper looks again
        assert set(held(engine)) == {"tiny", "second"}
    finally:
        engine.close()


class HeldAtFirstToken(Collector):
    """Holds the lane's thread at the request's first token until released: the request
    is surely running when the test acts."""

    def __init__(self):
        super().__init__()
        self.first, self.release = threading.Event(), threading.Event()

    def __call__(self, event):
        super().__call__(event)
        if isinstance(event, Delta) and not self.first.is_set():
            self.first.set()
            self.release.wait(10)


def test_unloading_by_hand_ends_its_requests_with_an_error(tiny_store, models):
    tiny, second, _ = models
    engine = engine_with(tiny_store)
    try:
        ask(engine, tiny)
        ask(engine, second)
        running = HeldAtFirstToken()
        engine.submit(GenerationRequest(model=second, prompt="go on", max_tokens=100,
                                        ignore_eos=True, sampling=GREEDY), running)
        assert running.first.wait(10)
        threading.Timer(0.3, running.release.set).start()  # while the unload waits for it
        assert engine.unload("second")
        end = running.result()[2]
        assert isinstance(end, Failed) and isinstance(end.error, ModelUnloaded), end
        assert "unloaded by hand" in end.error.message
        assert set(held(engine)) == {"tiny"} and not engine.unload("second")
    finally:
        engine.close()


def test_a_model_loaded_on_demand_loads_with_its_preset(tiny_store, models, tmp_path):
    tiny, second, _ = models
    presets = tmp_path / "presets.json"
    engine = Engine(tiny_store, EngineSettings(LoadSettings(n_ctx=512, n_batch=64),
                                               presets_file=presets))
    try:
        engine.presets.set("second", load=LoadOverride(n_ctx=256), keep=Keep(ttl_s=60))
        ask(engine, tiny)
        ask(engine, second)
        loaded = held(engine)
        assert loaded["tiny"]["n_ctx"] == 512 and loaded["second"]["n_ctx"] == 256
        assert loaded["second"]["ttl_s"] == 60
    finally:
        engine.close()
    assert presets.stat().st_mode & 0o777 == 0o600
    again = Presets(presets).get("second")  # kept for the next engine
    assert again.load == LoadOverride(n_ctx=256) and again.keep == Keep(ttl_s=60)


def test_a_model_that_fails_to_load_beside_leaves_no_lane_behind(tiny_store, models, tiny_bert):
    tiny, _, _ = models
    (tiny_store.folder / "broken.gguf").write_bytes(b"GGUF" + b"\0" * 64)
    engine = engine_with(tiny_store, max_models=2)
    try:
        ask(engine, tiny)
        broken = tiny_store.resolve("broken")
        for _ in range(3):  # a clear error each time, before any lane is opened for it
            with pytest.raises(InvalidModelFile) as raised:
                run(engine, model=broken, prompt="x", max_tokens=2, sampling=GREEDY)
            assert "damaged" in raised.value.message
        embedding = tiny_store.add(tiny_bert)
        for _ in range(2):  # the planner reads it; its lane fails to load it, and goes
            _, _, end = run(engine, model=embedding, prompt="x", max_tokens=2, sampling=GREEDY)
            assert isinstance(end, Failed) and "embedding model" in end.error.message, end
            wait_for(lambda: len(engine.fleet.lanes()) == 1)
        assert set(held(engine)) == {"tiny"}
        ask(engine, tiny)
    finally:
        engine.close()


def test_a_reload_before_any_request_is_no_crash(tiny_store, models, tmp_path):
    """A model loaded, then loaded again with another context before a request ran (the
    app's Memory page, a bench): the first load's watch ended when it was unloaded, so the
    second is not mistaken for a start after a crash (which loads without repacked
    weights, slower, for good)."""
    tiny, _, _ = models
    settings = EngineSettings(LOAD, load_journal=tmp_path / "run" / "loading.json",
                              no_repack_file=tmp_path / "no-repack.json")
    engine = Engine(tiny_store, settings)
    try:
        for n_ctx in (256, 512, 256):
            done = Collector()
            engine.load(tiny, LoadOverride(n_ctx=n_ctx), done)
            assert isinstance(done.result()[2], Finished)
        assert engine.status()["load_notes"] == []
        assert not settings.no_repack_file.exists()
    finally:
        engine.close()
    assert not list((tmp_path / "run").glob("loading*.json"))  # a clean stop is no crash
