"""Routing between a small and a large model (engine/routing.py) in-process, on tiny
random models: the rules, the cascade (a model with a flat output distribution is as
unsure as a model can be, so it escalates deterministically) and the pair's plan."""

import pytest

from support.engines import GREEDY, run
from support.models import with_flat_output
from engine.engine import Engine
from engine.settings import EngineSettings, LoadSettings
from engine.errors import InvalidRequest
from engine.events import Finished, GenerationRequest
from engine.catalog.models import LocalModel
from engine.routing import Routing, Rules, decide

SMALL = LocalModel("small", None, 0, False)
LARGE = LocalModel("large", None, 0, False)
RULES = Routing(SMALL, LARGE)
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}


def user(*texts: str) -> tuple[dict, ...]:
    return tuple({"role": role, "content": text}
                 for text in texts for role in ("user", "assistant"))[:-1]


@pytest.mark.parametrize("messages, tools, large", [
    (user("What is the capital of France?"), None, False),
    (user("How many legs does a spider have?"), None, False),
    (user("Write a Python function that reverses a string."), None, True),
    (user("Why does this fail?\n```\nx = [1, 2\n```"), None, True),
    (user("fix: const x = () => { return 1 }"), None, True),
    (user("What's the weather in Paris?"), (TOOL,), True),
    (user("Summarize: " + "The council met on Tuesday. " * 80), None, True),
    (user("hi", "how are you", "tell me more", "and then?", "why?"), None, True),
    (user("hi", "what is 2+2?"), None, False),
], ids=["fact", "fact2", "code-words", "code-fence", "code-syntax", "tools", "long", "deep",
        "short-chat"])
def test_rules(messages, tools, large):
    decision = decide(RULES, GenerationRequest(SMALL, messages=messages, tools=tools))
    assert decision.model is (LARGE if large else SMALL), decision.reason
    assert decision.escalate_to is None


def test_the_rules_read_a_raw_prompt_too():
    assert decide(RULES, GenerationRequest(SMALL, prompt="def add(a, b):")).model is LARGE
    assert decide(RULES, GenerationRequest(SMALL, prompt="The sky is")).model is SMALL


def test_the_rules_thresholds_are_settings():
    loose = Routing(SMALL, LARGE, rules=Rules(long_prompt_chars=10))
    assert decide(loose, GenerationRequest(SMALL, messages=user("a question longer than ten"))
                  ).model is LARGE


def test_a_cascade_lets_the_small_model_try_unless_tools_or_a_grammar_decide():
    cascade = Routing(SMALL, LARGE, "cascade", 0.4)
    plain = decide(cascade, GenerationRequest(SMALL, messages=user("Write code")))
    assert plain.model is SMALL and plain.escalate_to is LARGE
    for extra in ({"tools": (TOOL,)}, {"grammar": 'root ::= "x"'}):
        ruled = decide(cascade, GenerationRequest(SMALL, messages=user("hi"), **extra))
        assert ruled.escalate_to is None


# -- in the engine ----------------------------------------------------------------------

@pytest.fixture
def pair(tiny_store, tiny_model):
    """A store with the tiny model and its flat copy."""
    with_flat_output(tiny_model, tiny_store.folder / "flat.gguf")
    return tiny_store.resolve("flat"), tiny_store.resolve("tiny")


@pytest.fixture
def engine(tiny_store):
    engine = Engine(tiny_store, EngineSettings(LoadSettings(n_ctx=256, n_batch=64)))
    yield engine
    engine.close()


def ask(engine, placeholder, text="what is the capital of France?"):
    return run(engine, model=placeholder, routed=True, max_tokens=6, sampling=GREEDY,
               messages=({"role": "user", "content": text},))


def test_auto_without_a_pair_explains_how_to_configure_one(engine, tiny_store):
    with pytest.raises(InvalidRequest) as raised:
        engine.submit(GenerationRequest(tiny_store.resolve("tiny"), prompt="x", routed=True),
                      lambda _e: None)
    assert "--route" in raised.value.message and raised.value.param == "model"


def test_the_cascade_escalates_a_flat_distribution(engine, pair):
    flat, tiny = pair
    plan = engine.router.set(Routing(flat, tiny, "cascade", 0.05))
    assert plan["together"], plan
    started, text, done = ask(engine, tiny)
    assert isinstance(done, Finished) and text
    assert started.model == "tiny" and started.route["escalated"], started.route
    n_vocab = engine.fleet.main.host.loaded.llama.n_vocab
    assert started.route["confidence"] == pytest.approx(1 / n_vocab, rel=0.01)
    assert started.route["small"] == "flat"


def test_the_cascade_keeps_a_confident_enough_answer(engine, pair):
    flat, tiny = pair
    engine.router.set(Routing(flat, tiny, "cascade", 0.0))
    started, text, done = ask(engine, tiny)
    assert isinstance(done, Finished)
    assert started.model == "flat" and not started.route["escalated"]
    assert done.usage.confidence == pytest.approx(started.route["confidence"], abs=1e-4)


def test_rules_route_in_the_engine_and_both_models_stay_loaded(engine, pair):
    flat, tiny = pair
    engine.router.set(Routing(flat, tiny, "rules"))
    short = ask(engine, tiny)
    code = ask(engine, tiny, "write a python function")
    assert short[0].model == "flat" and short[0].route["mode"] == "rules"
    assert code[0].model == "tiny" and "code" in code[0].route["reason"]
    status = engine.status()
    assert status["routing"]["together"] and status["routing"]["companion"]["model"] == "flat"
    assert status["model"] == "tiny"


def test_a_pair_that_cannot_stay_loaded_together_is_said_so(tiny_store, pair, engine):
    flat, tiny = pair
    one = engine.plan_for(tiny).uses[0].total
    engine = Engine(tiny_store, EngineSettings(LoadSettings(n_ctx=256, n_batch=64),
                                               ram_budget=int(one * 1.7)))  # room for one
    try:
        plan = engine.router.plan(flat, tiny)
        assert engine.plan_for(tiny).fits
        assert not plan["together"] and "swaps the model" in plan["note"]
        engine.router.set(Routing(flat, tiny, "rules"))
        assert engine.router.companion is None
        assert ask(engine, tiny)[0].model == "flat"  # served, by swapping
        assert ask(engine, tiny, "write code")[0].model == "tiny"
    finally:
        engine.close()


def test_routing_turns_off(engine, pair):
    flat, tiny = pair
    engine.router.set(Routing(flat, tiny))
    engine.router.set(None)
    assert engine.router.companion is None and engine.status()["routing"] is None
    with pytest.raises(InvalidRequest):
        ask(engine, tiny)
