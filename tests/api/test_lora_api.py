"""LoRA adapters through the API, with the official clients, on the shared engine process
over the starter chat model (its models folder holds ADAPTER, see conftest.py): the `lora`
field, `BASE+ADAPTER` model ids, the listing, and bad adapters refused with the right
status."""

from __future__ import annotations

import re

import anthropic
import openai
import pytest

from support.engines import models_once_read
from support.models import ADAPTER, GEMMA, PARIS_QUESTION, STARTER

pytestmark = pytest.mark.slow
QUESTION = [{"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": PARIS_QUESTION}]
FRESH = {"response_cache": "off", "cache_prompt": False}  # each answer computed afresh


@pytest.fixture(scope="module")
def address(server):
    return server[0]


@pytest.fixture(scope="module")
def client(address):
    return openai.OpenAI(base_url=f"{address.url}/v1", api_key=address.token, max_retries=0)


def _ask(client, model, **extra):
    reply = client.chat.completions.create(model=model, messages=QUESTION, max_tokens=24,
                                           temperature=0, extra_body={**FRESH, **extra})
    return reply


def test_the_adapter_answers_through_the_lora_field_and_the_model_id(client):
    base = _ask(client, STARTER)
    by_field = _ask(client, STARTER, lora=[{"id": ADAPTER, "scale": 1.0}])
    by_name = _ask(client, f"{STARTER}+{ADAPTER}")
    assert by_field.model == by_name.model == f"{STARTER}+{ADAPTER}"
    assert by_field.choices[0].message.content == by_name.choices[0].message.content
    assert by_field.choices[0].message.content != base.choices[0].message.content
    scaled_to_zero = _ask(client, STARTER, lora=[{"id": ADAPTER, "scale": 0.0}])
    assert scaled_to_zero.choices[0].message.content == base.choices[0].message.content


def test_the_anthropic_client_takes_an_adapter_by_model_id(address, client):
    claude = anthropic.Anthropic(base_url=address.url, api_key=address.token, max_retries=0)
    reply = claude.messages.create(model=f"{STARTER}+{ADAPTER}", max_tokens=24,
                                   system=QUESTION[0]["content"], messages=QUESTION[1:],
                                   extra_body={**FRESH, "temperature": 0})
    expected = _ask(client, f"{STARTER}+{ADAPTER}")
    assert reply.model == f"{STARTER}+{ADAPTER}"
    assert reply.content[0].text == expected.choices[0].message.content


def test_models_lists_the_adapter_under_its_base(http):
    models = models_once_read(http)
    entry = models[ADAPTER]
    assert entry["kind"] == "adapter" and entry["base"] == STARTER
    assert entry["use_as"] == f"{STARTER}+{ADAPTER}"
    assert entry["adapter"]["rank"] == 4 and entry["adapter"]["tensors"] == 60
    assert models["gemma-style"]["base"] == GEMMA
    listed = http.get("/lora-adapters").json()
    index = next(a["id"] for a in listed if a["name"] == ADAPTER)
    body = {"model": STARTER, "messages": QUESTION, "max_tokens": 4,
            "lora": [{"id": index, "scale": 1.0}], **FRESH}
    answer = http.post("/v1/chat/completions", json=body).json()
    assert answer["model"] == f"{STARTER}+{ADAPTER}"
    assert answer["homerack"]["adapters"] == [{"id": ADAPTER, "scale": 1.0}]
    metrics = http.get("/metrics").text
    assert re.search(r"^homerack_adapters_loaded [1-9]", metrics, re.M)
    assert re.search(r"^homerack_adapter_switches_total [1-9]", metrics, re.M)


@pytest.mark.parametrize("lora, status, words", [
    ([{"id": "nobody", "scale": 1.0}], 404, "adapter 'nobody' not found"),
    ([{"id": "gemma-style", "scale": 1.0}], 400,
     f"adapter gemma-style does not fit model {STARTER}: it adapts gemma3 models"),
    ([{"id": ADAPTER, "scale": 40.0}], 400, "outside -4..4"),
    ([{"id": ADAPTER, "scale": "NaN"}], 400, "lora.0.scale"),
    ([{"id": 99}], 404, "no adapter has index 99"),
])
def test_bad_adapters_get_clear_errors_and_the_model_serves_on(http, lora, status, words):
    body = {"model": STARTER, "messages": QUESTION, "max_tokens": 4, "lora": lora}
    answer = http.post("/v1/chat/completions", json=body)
    assert answer.status_code == status, answer.text
    assert words in answer.json()["error"]["message"]
    assert answer.json()["error"]["param"].startswith("lora")
    ok = http.post("/v1/chat/completions", json={**body, "lora": None, **FRESH})
    assert ok.status_code == 200
