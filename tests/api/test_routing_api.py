"""The response cache and model "auto" through a real `homerack serve` and the official
clients: a hit streams like any answer, is marked, and runs no model; the cache obeys
Cache-Control; "auto" answers with the model the rules or the cascade chose, named in
the response's `model` field."""

import uuid

import anthropic
import openai
import pytest

from support.engines import api_client, start_engine
from support.models import GEMMA, STARTER

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cached(home):
    """An engine with the response cache on (as `homerack serve` starts by default)."""
    process, address, _ = start_engine(home, "cached", [
        "--model", STARTER, "--ctx", "2048", "--response-cache-mib", "64"])
    yield address
    process.stop()


@pytest.fixture(scope="module")
def client(cached):
    return openai.OpenAI(base_url=f"{cached.url}/v1", api_key=cached.token, max_retries=0)


@pytest.fixture(scope="module")
def http(cached):
    with api_client(cached) as session:
        yield session


def generated(http) -> int:
    """Tokens the engine has evaluated, once its figures have settled: they are published
    after the step that finished a request, which can be after its client has the answer."""
    import time

    def read() -> int:
        batching = http.get("/health").json()["batching"]
        return batching["generated_tokens"] + batching["prompt_tokens"]

    last = read()
    while True:
        time.sleep(0.3)  # > PUBLISH_S (engine/batching/lane.py)
        now = read()
        if now == last:
            return now
        last = now


def greedy(client, question, **extra):
    return client.chat.completions.create(
        model=STARTER, messages=[{"role": "user", "content": question}], temperature=0,
        max_tokens=16, **extra)


def test_a_repeated_greedy_request_is_answered_from_the_cache(client, http):
    question = f"Name a color. ({uuid.uuid4().hex[:6]})"
    first = greedy(client, question)
    before = generated(http)
    second = greedy(client, question)
    assert generated(http) == before  # no decode, no prompt evaluation
    assert first.model_extra["homerack"]["response_cache"] == "miss"
    assert second.model_extra["homerack"]["response_cache"] == "hit"
    assert second.usage.model_extra["response_cache"] == "hit"
    assert second.choices[0].message.content == first.choices[0].message.content
    assert second.choices[0].finish_reason == first.choices[0].finish_reason
    assert (second.usage.prompt_tokens, second.usage.completion_tokens) == \
        (first.usage.prompt_tokens, first.usage.completion_tokens)
    # streamed, a hit comes in pieces as the answer first did
    chunks = list(client.chat.completions.create(
        model=STARTER, messages=[{"role": "user", "content": question}], temperature=0,
        max_tokens=16, stream=True, stream_options={"include_usage": True}))
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 1 and "".join(pieces) == first.choices[0].message.content
    assert chunks[-1].usage.model_extra["response_cache"] == "hit"
    assert generated(http) == before


def test_cache_control_and_the_body_field_opt_out(client):
    question = f"Name a fruit. ({uuid.uuid4().hex[:6]})"
    greedy(client, question)
    fresh = greedy(client, question, extra_headers={"Cache-Control": "no-cache"})
    assert fresh.model_extra["homerack"]["response_cache"] == "bypass"
    assert "response_cache" not in fresh.usage.model_extra
    unstored = f"Name a city. ({uuid.uuid4().hex[:6]})"
    greedy(client, unstored, extra_body={"response_cache": "off"})
    assert greedy(client, unstored).model_extra["homerack"]["response_cache"] == "miss"


def test_anthropic_messages_are_cached_too(cached):
    claude = anthropic.Anthropic(base_url=cached.url, api_key=cached.token, max_retries=0)
    question = f"Say hello. ({uuid.uuid4().hex[:6]})"
    answers = [claude.messages.create(model=STARTER, max_tokens=12, extra_body={"temperature": 0},
                                      messages=[{"role": "user", "content": question}])
               for _ in range(2)]
    assert answers[1].content[0].text == answers[0].content[0].text
    assert [a.model_extra["homerack"]["response_cache"] for a in answers] == ["miss", "hit"]


def test_responses_are_cached_too(client):
    question = f"Say goodbye. ({uuid.uuid4().hex[:6]})"
    answers = [client.responses.create(model=STARTER, input=question, temperature=0,
                                       max_output_tokens=12) for _ in range(2)]
    assert answers[1].output_text == answers[0].output_text
    assert [a.model_extra["homerack"]["response_cache"] for a in answers] == ["miss", "hit"]


def test_auto_without_a_pair_is_400_saying_how(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "hi"}])
    error = raised.value.body
    assert error["param"] == "model" and "--route" in error["message"]


@pytest.fixture(scope="module")
def routed(home):
    process, address, _ = start_engine(home, "routing", [
        "--ctx", "2048", "--route", f"{STARTER},{GEMMA}", "--response-cache-mib", "0"])
    yield openai.OpenAI(base_url=f"{address.url}/v1", api_key=address.token, max_retries=0), address
    process.stop()


def ask_auto(client, question):
    return client.chat.completions.create(
        model="auto", messages=[{"role": "user", "content": question}], temperature=0,
        max_tokens=12)


def test_auto_routes_by_the_rules_and_names_the_answering_model(routed):
    client, _ = routed
    models = [m.id for m in client.models.list().data]
    assert models[0] == "auto"
    short = ask_auto(client, "What is the capital of Italy?")
    code = ask_auto(client, "Write a Python function that adds two numbers.")
    assert short.model == STARTER and code.model == GEMMA
    assert short.model_extra["homerack"]["route"]["mode"] == "rules"
    assert "code" in code.model_extra["homerack"]["route"]["reason"]


def test_the_pair_is_planned_and_switches_to_a_cascade(routed):
    client, address = routed
    import httpx

    with httpx.Client(base_url=address.url, timeout=120,
                      headers={"Authorization": f"Bearer {address.token}"}) as http:
        state = http.get("/v1/routing").json()
        assert state["plan"]["together"] and state["routing"]["small"] == STARTER
        assert http.get("/health").json()["routing"]["companion"]["model"] == STARTER
        bad = http.put("/v1/routing", json={"small": STARTER, "large": "no-such-model"})
        assert bad.status_code == 404 and "no-such-model" in bad.json()["error"]["message"]
        same = http.put("/v1/routing", json={"small": STARTER, "large": STARTER})
        assert same.status_code == 400 and same.json()["error"]["param"] == "large"
        for threshold, model in ((1.0, GEMMA), (0.0, STARTER)):
            put = http.put("/v1/routing", json={"small": STARTER, "large": GEMMA,
                                                "mode": "cascade", "threshold": threshold})
            assert put.status_code == 200 and put.json()["plan"]["together"]
            answer = ask_auto(client, "What is the capital of Italy?")
            route = answer.model_extra["homerack"]["route"]
            assert answer.model == model and route["escalated"] == (model == GEMMA)
            assert 0 < route["confidence"] < 1
        assert http.delete("/v1/routing").json() == {"routing": None}
        assert "auto" not in [m["id"] for m in http.get("/v1/models").json()["data"]]
