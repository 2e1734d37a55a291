"""One request's failure is its own (issue 80): whatever its work raises, on admission or
in a step, that request ends with an error and the requests beside it go on with their
KV memory, token for token what they give alone. The text a request brings is checked
where it arrives (the API's guard); here, below it, a lone surrogate in a grammar raises
llama.cpp's own UnicodeEncodeError on the model's worker, as it did from the API."""

from __future__ import annotations

import pytest

from support.engines import GREEDY, Collector, run, settled
from engine.engine import Engine
from engine.errors import ContextLengthExceeded
from engine.events import Failed, Finished, GenerationRequest
from engine.settings import EngineSettings, LoadSettings
from engine.batching import slot as slot_module

STREAM = {"prompt": "the owner's long answer", "max_tokens": 120, "ignore_eos": True,
          "sampling": GREEDY}


@pytest.fixture
def engine(tiny_store):
    engine = Engine(tiny_store, EngineSettings(LoadSettings(n_ctx=512, n_batch=64),
                                               parallel=4))
    yield engine, tiny_store.resolve("tiny")
    engine.close()


def _stream(engine, model) -> Collector:
    collector = Collector()
    engine.submit(GenerationRequest(model=model, **STREAM), collector)
    return collector


def test_a_request_whose_admission_raises_fails_alone(engine):
    engine, model = engine
    alone = run(engine, model=model, **STREAM)[1]
    owner = _stream(engine, model)
    bad = Collector()
    engine.submit(GenerationRequest(model=model, prompt="hi", max_tokens=4,
                                    grammar='root ::= "\ud800"'), bad)
    failed = bad.result()[2]
    assert isinstance(failed, Failed) and "UnicodeEncodeError" in failed.error.message
    _, text, done = owner.result()
    assert isinstance(done, Finished) and done.finish_reason == "length" and text == alone
    figures = settled(engine)
    assert figures["resident"] >= 1 and figures["kv_cells_used"] > 0  # nothing cleared


def test_a_step_that_raises_for_one_request_fails_that_request_alone(engine, monkeypatch):
    engine, model = engine
    alone = run(engine, model=model, **STREAM)[1]
    take = slot_module.Output.take

    def taking(output, token):
        if output.job.request.stop == ("boom",):
            raise RuntimeError("its text could not be read")
        return take(output, token)

    monkeypatch.setattr(slot_module.Output, "take", taking)
    owner = _stream(engine, model)
    bad = Collector()
    engine.submit(GenerationRequest(model=model, prompt="another", max_tokens=8,
                                    stop=("boom",), sampling=GREEDY), bad)
    assert isinstance(bad.result()[2], Failed)
    _, text, done = owner.result()
    assert done.finish_reason == "length" and text == alone


def test_a_prompt_longer_than_any_context_is_refused_before_the_worker_sees_it(engine):
    """Tokenized on the submitting thread, its beginning only: the model's worker (and
    every stream on it) never spends a moment on it, and nothing of it is kept."""
    engine, model = engine
    owner = _stream(engine, model)
    huge = "many words of a pasted book " * 200_000  # 5.6 MB
    with pytest.raises(ContextLengthExceeded, match="more than"):
        engine.submit(GenerationRequest(model=model, prompt=huge, max_tokens=4), Collector())
    assert owner.result()[2].finish_reason == "length"
    turns = engine.fleet.main.host.loaded.llama._turns
    assert turns is None or turns.held.used < 1 << 20
