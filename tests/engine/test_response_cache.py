"""The response cache (engine/response_cache.py) in-process, on tiny random models:
exact hits only, never a decode on a hit, on disk across restarts, invalidated with the
model file, and never a failed request for a broken cache."""

import sqlite3
from dataclasses import replace

import pytest

from support.engines import GREEDY, run
from tiny_gguf import write_tiny_model
from engine.engine import Engine
from engine.settings import EngineSettings, LoadSettings
from engine.events import Finished, SamplingParams


def chat(text: str, system: str = "You are terse.") -> tuple[dict, ...]:
    return ({"role": "system", "content": system}, {"role": "user", "content": text})


@pytest.fixture
def make_engine(tiny_store, tmp_path):
    engines = []

    def make(**settings):
        engine = Engine(tiny_store, EngineSettings(
            LoadSettings(n_ctx=256, n_batch=64), response_cache=tmp_path / "answers.sqlite",
            **settings))
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.close()


def ask(engine, model, **request):
    request = {"messages": chat("what is 12 + 5?"), "max_tokens": 8, "sampling": GREEDY,
               **request}
    return run(engine, model=model, **request)


def generated(engine) -> int:
    return engine.fleet.main.scheduler.figures.evaluated_tokens()


def test_a_repeated_greedy_request_is_replayed_without_a_decode(make_engine, tiny_store):
    engine, model = make_engine(), tiny_store.resolve("tiny")
    first = ask(engine, model)
    evaluated = generated(engine)
    second = ask(engine, model)
    assert first[0].response_cache == "miss" and second[0].response_cache == "hit"
    assert second[1] == first[1] and second[2].finish_reason == first[2].finish_reason
    assert second[2].usage.from_response_cache and not first[2].usage.from_response_cache
    assert second[2].usage.completion_tokens == first[2].usage.completion_tokens
    assert second[0].prompt_tokens == first[0].prompt_tokens
    assert generated(engine) == evaluated  # the model did not run
    assert engine.answers.stats["hits"] == 1


@pytest.mark.parametrize("change", [
    dict(messages=chat("what is 12 + 6?")),                  # one digit
    dict(messages=chat("what is not 12 + 5?")),              # a negation
    dict(messages=chat("what is 12 + 5?", system="You are verbose.")),  # the system prompt
    dict(max_tokens=9),
    dict(stop=("\n",)),
    dict(sampling=SamplingParams(temperature=0.7, seed=1)),  # a sampling setting
    dict(sampling=replace(GREEDY, frequency_penalty=0.5)),
    dict(tools=({"type": "function", "function": {"name": "f", "parameters": {}}},)),
    dict(grammar='root ::= "a"+'),
], ids=["digit", "negation", "system", "max_tokens", "stop", "sampling", "penalty", "tools",
        "grammar"])
def test_a_request_that_differs_anywhere_misses(make_engine, tiny_store, change):
    engine, model = make_engine(), tiny_store.resolve("tiny")
    ask(engine, model)
    evaluated = generated(engine)
    started, _text, done = ask(engine, model, **change)
    assert started.response_cache == "miss" and not done.usage.from_response_cache
    assert generated(engine) > evaluated


def test_another_context_size_misses(make_engine, tiny_store):
    from engine.presets import LoadOverride

    engine, model = make_engine(), tiny_store.resolve("tiny")
    ask(engine, model)
    engine.load(model, LoadOverride(n_ctx=128))
    assert ask(engine, model)[0].response_cache == "miss"


def test_sampling_without_a_seed_never_touches_the_cache(make_engine, tiny_store):
    engine, model = make_engine(), tiny_store.resolve("tiny")
    hot = SamplingParams(temperature=0.9)
    for _ in range(2):
        started, _text, done = ask(engine, model, sampling=hot)
        assert started.response_cache is None and not done.usage.from_response_cache
    assert engine.answers.stats["stores"] == 0 and engine.answers.stats["hits"] == 0


def test_a_seeded_request_is_cached(make_engine, tiny_store):
    engine, model = make_engine(), tiny_store.resolve("tiny")
    seeded = SamplingParams(temperature=0.9, seed=42)
    first, second = ask(engine, model, sampling=seeded), ask(engine, model, sampling=seeded)
    assert second[0].response_cache == "hit" and second[1] == first[1]


def test_opting_out(make_engine, tiny_store):
    engine, model = make_engine(), tiny_store.resolve("tiny")
    ask(engine, model)
    refreshed = ask(engine, model, response_cache="refresh")  # Cache-Control: no-cache
    assert refreshed[0].response_cache == "bypass" and not refreshed[2].usage.from_response_cache
    off = ask(engine, model, response_cache="off", max_tokens=5)  # no-store
    assert off[0].response_cache is None
    engine.answers.flush()
    assert ask(engine, model, max_tokens=5)[0].response_cache == "miss"  # nothing was kept


def test_answers_survive_a_restart_and_die_with_the_model_file(make_engine, tiny_store):
    model = tiny_store.resolve("tiny")
    engine = make_engine()
    first = ask(engine, model)
    engine.close()
    again = make_engine()
    second = ask(again, model)
    assert second[0].response_cache == "hit" and second[1] == first[1]
    # the file changes (another model under the same name): its old answers are gone
    write_tiny_model(model.path, seed=99)
    changed = ask(again, tiny_store.resolve("tiny"))
    assert changed[0].response_cache == "miss" and not changed[2].usage.from_response_cache
    again.answers.flush()
    assert again.answers.stats["dropped"] >= 1


def test_a_corrupt_entry_is_dropped_and_answered_afresh(make_engine, tiny_store, caplog):
    engine, model = make_engine(), tiny_store.resolve("tiny")
    first = ask(engine, model)
    engine.answers.flush()
    with sqlite3.connect(engine.answers.path) as db:
        db.execute("UPDATE answers SET body = substr(body, 1, 20)")
    again = ask(engine, model)
    assert isinstance(again[2], Finished) and again[1] == first[1]
    assert again[0].response_cache == "miss" and engine.answers.stats["dropped"] == 1
    assert "unreadable entry" in caplog.text


def test_a_corrupt_cache_file_is_set_aside(tiny_store, tmp_path, make_engine, caplog):
    path = tmp_path / "answers.sqlite"
    path.write_bytes(b"this is not a database" * 200)
    engine, model = make_engine(), tiny_store.resolve("tiny")
    assert ask(engine, model)[0].response_cache == "miss"
    assert ask(engine, model)[0].response_cache == "hit"  # a new file works
    assert (tmp_path / "answers.sqlite.corrupt").exists()
    assert "response cache open failed" in caplog.text


def test_a_full_disk_stops_the_writes_not_the_requests(make_engine, tiny_store, caplog):
    engine, model = make_engine(), tiny_store.resolve("tiny")
    with engine.answers._lock:  # SQLITE_FULL, as from a full disk
        pages = engine.answers._db.execute("PRAGMA page_count").fetchone()[0]
        engine.answers._db.execute(f"PRAGMA max_page_count = {pages}")
    for i in range(20):
        started, _text, done = ask(engine, model, messages=chat(f"question {i}"))
        assert isinstance(done, Finished) and started.response_cache == "miss"
    engine.answers.flush()
    assert engine.answers.stats["errors"] >= 1 and "full" in (engine.answers.problem or "")
    assert "requests are served without it" in caplog.text


def test_the_cache_is_bounded_least_recently_used_out(make_engine, tiny_store):
    engine, model = make_engine(response_cache_bytes=2000), tiny_store.resolve("tiny")
    questions = [f"question {i}" for i in range(12)]
    for question in questions:
        ask(engine, model, messages=chat(question))
        ask(engine, model, messages=chat(questions[0]))  # kept in use: never evicted
    engine.answers.flush()
    status = engine.answers.status()
    assert status["bytes"] <= 2000 and status["evictions"] > 0
    assert ask(engine, model, messages=chat(questions[0]))[0].response_cache == "hit"
    assert ask(engine, model, messages=chat(questions[1]))[0].response_cache == "miss"


def test_no_cache_folder_no_cache(tiny_store):
    engine = Engine(tiny_store, EngineSettings(LoadSettings(n_ctx=256, n_batch=64)))
    try:
        started, _text, _done = ask(engine, tiny_store.resolve("tiny"))
        assert started.response_cache is None and engine.status()["response_cache"] is None
    finally:
        engine.close()
