"""The generation loop in-process, on tiny random models (fast)."""

import queue
import threading

import pytest

from engine.errors import ContextLengthExceeded, InvalidModelFile, QueueFull
from engine.generation import (Delta, Engine, EngineSettings, Failed, Finished,
                               GenerationRequest, Started)
from engine.llama_runtime import LoadSettings, SamplingParams

GREEDY = SamplingParams(temperature=0)


class Collector:
    def __init__(self):
        self.events = queue.Queue()

    def __call__(self, event):
        self.events.put(event)

    def result(self, timeout=60):
        started, text = None, ""
        while True:
            event = self.events.get(timeout=timeout)
            if isinstance(event, Started):
                started = event
            elif isinstance(event, Delta):
                text += event.text
            elif isinstance(event, (Finished, Failed)):
                return started, text, event


@pytest.fixture
def engine(tiny_store):
    engine = Engine(tiny_store, EngineSettings(LoadSettings(n_ctx=256, n_batch=64), max_queue=2))
    yield engine
    engine.close()


def run(engine, **request):
    collector = Collector()
    engine.submit(GenerationRequest(**request), collector)
    return collector.result()


def test_chat_generation_reports_usage(engine, tiny_store):
    model = tiny_store.resolve("tiny")
    started, text, done = run(engine, model=model, messages=({"role": "user", "content": "hi"},),
                              max_tokens=12, sampling=GREEDY)
    assert isinstance(done, Finished), done
    assert started.chat_format == "model template (from the model file)"
    assert done.usage.completion_tokens <= 12 and done.usage.prompt_tokens == started.prompt_tokens
    assert done.finish_reason in ("length", "stop")


def test_greedy_is_repeatable_and_reuses_the_prompt_prefix(engine, tiny_store):
    model = tiny_store.resolve("tiny")
    request = dict(model=model, prompt="the cat is on the mat", max_tokens=10, sampling=GREEDY)
    first = run(engine, **request)
    second = run(engine, **request)
    assert first[1] == second[1]
    assert first[2].usage.cached_tokens == 0
    assert second[2].usage.cached_tokens == second[2].usage.prompt_tokens - 1


def test_seeded_sampling_is_repeatable(engine, tiny_store):
    model = tiny_store.resolve("tiny")
    request = dict(model=model, prompt="hello world", max_tokens=16,
                   sampling=SamplingParams(temperature=1.0, seed=42))
    assert run(engine, **request)[1] == run(engine, **request)[1]


def test_max_tokens_beyond_context_is_clamped_with_a_note(engine, tiny_store):
    started, _, done = run(engine, model=tiny_store.resolve("tiny"), prompt="the cat",
                           max_tokens=100_000, sampling=GREEDY)
    assert isinstance(done, Finished)
    assert any("clamped" in note for note in started.notes)
    assert started.max_tokens == 256 - started.prompt_tokens


def test_prompt_longer_than_context_fails_cleanly(engine, tiny_store):
    _, _, done = run(engine, model=tiny_store.resolve("tiny"), prompt="the cat " * 400)
    assert isinstance(done, Failed) and isinstance(done.error, ContextLengthExceeded)
    assert isinstance(run(engine, model=tiny_store.resolve("tiny"), prompt="hi",
                          max_tokens=3)[2], Finished)


def test_truncated_model_fails_and_engine_keeps_serving(engine, tiny_store, tiny_model):
    broken = tiny_store.folder / "broken.gguf"
    broken.write_bytes(tiny_model.read_bytes()[:5000])
    _, _, done = run(engine, model=tiny_store.resolve("broken"), prompt="hi")
    assert isinstance(done, Failed) and isinstance(done.error, InvalidModelFile)
    assert isinstance(run(engine, model=tiny_store.resolve("tiny"), prompt="hi",
                          max_tokens=3)[2], Finished)


def test_cancel_stops_within_a_token(engine, tiny_store):
    collector = Collector()
    job = engine.submit(GenerationRequest(model=tiny_store.resolve("tiny"), prompt="hi",
                                          max_tokens=200, sampling=GREEDY), collector)
    job.cancel()
    _, _, done = collector.result()
    assert done.finish_reason == "cancelled" or done.usage.completion_tokens <= 2


def test_full_queue_is_refused_with_a_retry_hint(engine, tiny_store):
    model = tiny_store.resolve("tiny")
    gate, picked = threading.Event(), threading.Event()

    def blocking(event):  # holds the worker until the gate opens
        picked.set()
        gate.wait(30)

    engine.submit(GenerationRequest(model=model, prompt="hi", max_tokens=2), blocking)
    assert picked.wait(30)
    accepted, refused = [], []
    for _ in range(5):
        try:
            accepted.append(engine.submit(GenerationRequest(model=model, prompt="hi",
                                                            max_tokens=2), Collector()))
        except QueueFull as exc:
            refused.append(exc)
    gate.set()
    assert len(accepted) >= 2 and refused and refused[0].retry_after_s >= 1


@pytest.mark.slow
def test_cancel_during_a_long_prompt_stops_the_prefill(starters_dir):
    import time

    from engine.gguf_file import GGUFInspector
    from engine.models import ModelStore

    store = ModelStore(starters_dir, GGUFInspector())
    engine = Engine(store, EngineSettings(LoadSettings(n_ctx=4096, n_batch=256)))
    model = store.resolve("smollm2-135m-instruct-q4_1")
    run(engine, model=model, prompt="hi", max_tokens=1)  # loaded
    collector = Collector()
    job = engine.submit(GenerationRequest(model=model, prompt="word " * 3000, max_tokens=5),
                        collector)
    time.sleep(0.5)
    job.cancel()
    cancelled_at = time.perf_counter()
    _, _, done = collector.result()
    engine.close()
    assert done.finish_reason == "cancelled"
    assert time.perf_counter() - cancelled_at < 3  # the whole prompt takes ~12 s here
