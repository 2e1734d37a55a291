"""The generation loop in-process, on tiny random models (fast)."""

import threading
from dataclasses import replace

import pytest

from support.engines import GREEDY, Collector, run
from engine.errors import ContextLengthExceeded, InvalidModelFile, InvalidRequest, QueueFull
from engine.engine import Engine
from engine.settings import EngineSettings, LoadSettings
from engine.events import Delta, Failed, Finished, GenerationRequest, SamplingParams


@pytest.fixture
def engine(tiny_store):
    engine = Engine(tiny_store, EngineSettings(LoadSettings(n_ctx=256, n_batch=64), max_queue=2))
    yield engine
    engine.close()


def test_chat_generation_reports_usage(engine, tiny_store):
    model = tiny_store.resolve("tiny")
    started, text, done = run(engine, model=model, messages=({"role": "user", "content": "hi"},),
                              max_tokens=12, sampling=GREEDY)
    assert isinstance(done, Finished), done
    assert started.chat_format == "model template (from the model file; generic format)"
    assert done.usage.completion_tokens <= 12 and done.usage.prompt_tokens == started.prompt_tokens
    assert done.finish_reason in ("length", "stop")


def test_a_chat_is_rendered_once_for_the_cache_key_and_the_admission(tiny_store, tmp_path,
                                                                     monkeypatch):
    from engine.catalog.chat_format import ChatFormat

    rendered = []
    render = ChatFormat.render
    monkeypatch.setattr(ChatFormat, "render",
                        lambda self, *a, **k: rendered.append(1) or render(self, *a, **k))
    engine = Engine(tiny_store, EngineSettings(LoadSettings(n_ctx=256, n_batch=64),
                                               response_cache=tmp_path / "answers.sqlite"))
    try:
        request = dict(model=tiny_store.resolve("tiny"), max_tokens=4, sampling=GREEDY,
                       messages=({"role": "user", "content": "hi"},))
        started, _, done = run(engine, **request)
        assert isinstance(done, Finished) and started.response_cache == "miss"
        assert len(rendered) == 1
        assert run(engine, **request)[0].response_cache == "hit"  # the key was the same
    finally:
        engine.close()


def test_a_template_that_fails_fails_the_request_where_it_comes_in(tiny_store):
    """Rendered once, at submit: a template that raises is the request's InvalidRequest
    there (a 400 naming messages), and nothing reaches a lane to render it again."""
    from tiny_gguf import write_tiny_model

    write_tiny_model(tiny_store.folder / "strict.gguf",
                     chat_template="{{ raise_exception('roles must alternate') }}")
    engine = Engine(tiny_store, EngineSettings(LoadSettings(n_ctx=256, n_batch=64)))
    try:
        strict = tiny_store.resolve("strict")
        with pytest.raises(InvalidRequest, match="roles must alternate") as refused:
            engine.submit(GenerationRequest(model=strict, max_tokens=2,
                                            messages=({"role": "user", "content": "hi"},)),
                          lambda _event: None)
        assert refused.value.param == "messages"
        assert engine.status()["models"] == []  # no lane was asked to load it
    finally:
        engine.close()


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


def _deltas(engine, request: GenerationRequest, hold_at: int | None = None):
    """The Delta texts of a request, and its Finished; with hold_at, the worker is held
    at that Delta until the test cancels the job (returns the job and events then)."""
    reached, cancelled, finished = threading.Event(), threading.Event(), threading.Event()
    events = []

    def emit(event):
        events.append(("after" if cancelled.is_set() else "before", event))
        if isinstance(event, (Finished, Failed)):
            finished.set()
        if hold_at and sum(isinstance(e, Delta) for _, e in events) == hold_at \
                and not reached.is_set():
            reached.set()
            assert cancelled.wait(30)

    job = engine.submit(request, emit)
    if hold_at:
        assert reached.wait(60), f"generation never reached its Delta {hold_at}"
        job.cancel()
        cancelled.set()
    assert finished.wait(60)
    return events


def test_cancel_mid_decoding_stops_before_the_next_token(engine, tiny_store):
    """A cancel that lands between two tokens of a long generation: no token is decoded
    or emitted after it. Tokens and text pieces are not one to one (bytes of one character
    come as several tokens), so the count is checked against plain runs of the same
    greedy request: the cancelled run holds exactly the tokens that produced its text."""
    request = GenerationRequest(model=tiny_store.resolve("tiny"), prompt="hi", max_tokens=200,
                                ignore_eos=True, sampling=GREEDY)
    events = _deltas(engine, request, hold_at=5)
    after = [e for when, e in events if when == "after"]
    done = after[-1]
    assert isinstance(done, Finished) and done.finish_reason == "cancelled"
    assert all(isinstance(e, Delta) for e in after[:-1]) and len(after) <= 2  # a held-back tail
    produced = done.usage.completion_tokens
    text = "".join(e.text for _, e in events if isinstance(e, Delta))

    def plain(max_tokens):
        return [e for _, e in _deltas(engine, replace(request, max_tokens=max_tokens))
                if isinstance(e, Delta)]
    assert "".join(d.text for d in plain(produced)) == text
    assert len(plain(produced - 1)) < 5  # the 5th piece came with the last token counted


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

    from engine.catalog.gguf_file import GGUFInspector
    from engine.catalog.models import ModelStore

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


def test_a_load_reports_how_far_it_read_and_health_says_so(engine, tiny_store):
    """llama.cpp's progress callback: the app's model bar shows "Loading… 42%"."""
    from engine.llama.runtime import LlamaModel

    seen = []
    model = LlamaModel(tiny_store.resolve("tiny").path, LoadSettings(n_ctx=256),
                       on_progress=seen.append)
    assert seen and seen[-1] == 1.0 and seen == sorted(seen)
    model.close()
    run(engine, model=tiny_store.resolve("tiny"), messages=({"role": "user", "content": "hi"},),
        max_tokens=2, sampling=GREEDY)
    assert engine.status()["loading"] is None and engine.status()["model"] == "tiny"
