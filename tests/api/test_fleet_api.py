"""Several models in one real `homerack serve`, through the official client and the CLI:
requests naming two models at once are both answered by their own model, loaded side by
side (no swap); /v1/models/loaded, /v1/models, /metrics and `homerack models loaded` say
what is held; presets pin a model; unloading by hand frees it; bad input is refused."""

import os
import subprocess
import sys
import threading

import openai
import pytest

from support.engines import api_client, start_engine
from support.models import GEMMA, STARTER

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def fleet(home):
    process, address, _ = start_engine(home, "fleet", [
        "--model", STARTER, "--ctx", "1024", "--model-ttl", "10"])
    yield address, home / "fleet"
    process.stop()


@pytest.fixture(scope="module")
def http(fleet):
    with api_client(fleet[0]) as session:
        yield session


def loaded(http) -> dict:
    reply = http.get("/v1/models/loaded")
    reply.raise_for_status()
    return {entry["id"]: entry for entry in reply.json()["data"]}


def test_two_models_answer_at_once_each_in_its_own_lane(fleet, http):
    address, _ = fleet
    client = openai.OpenAI(base_url=f"{address.url}/v1", api_key=address.token, max_retries=0)
    answers = {}

    def ask(model):
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Name a colour."}],
            max_tokens=8, temperature=0, stream=True)
        chunks = list(stream)
        answers[model] = (chunks[0].model, "".join(c.choices[0].delta.content or ""
                                                   for c in chunks if c.choices))

    threads = [threading.Thread(target=ask, args=(model,)) for model in (STARTER, GEMMA)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert {model: answered for model, (answered, _) in answers.items()} == \
        {STARTER: STARTER, GEMMA: GEMMA}
    assert all(text for _, text in answers.values())

    held = loaded(http)
    assert set(held) == {STARTER, GEMMA}
    assert held[STARTER]["default"] and held[STARTER]["ttl_s"] is None
    assert not held[GEMMA]["default"] and held[GEMMA]["ttl_s"] == 600
    assert held[STARTER]["loads"] == held[GEMMA]["loads"] == 1
    assert all(entry["memory"]["CPU"] > 0 for entry in held.values())
    listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert listed[STARTER]["loaded"] and listed[GEMMA]["loaded"]
    metrics = http.get("/metrics").text
    assert f'homerack_model_memory_bytes{{device="CPU",model="{GEMMA}"}}' in metrics


def test_the_cli_lists_what_the_engine_holds(fleet, http):
    _, home = fleet
    loaded(http)
    shown = subprocess.run([sys.executable, "-m", "app", "models", "loaded"],
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, HOMERACK_HOME=str(home)))
    assert shown.returncode == 0, shown.stderr
    assert STARTER in shown.stdout and "the default" in shown.stdout


def test_a_preset_pins_and_unloading_frees_the_model(fleet, http):
    http.post("/v1/models/load", json={"model": GEMMA, "default": False}).raise_for_status()
    preset = http.put("/v1/models/preset", json={"model": GEMMA, "pinned": True})
    assert preset.status_code == 200 and preset.json()["keep"] == {"pinned": True, "ttl_s": None}
    assert loaded(http)[GEMMA]["pinned"]
    assert http.get("/v1/models/preset", params={"model": GEMMA}).json()["keep"]["pinned"]

    reply = http.post("/v1/models/unload", json={"model": GEMMA})
    assert reply.status_code == 200 and GEMMA not in {m["id"] for m in reply.json()["loaded"]}
    assert set(loaded(http)) == {STARTER}
    again = http.post("/v1/models/unload", json={"model": GEMMA})
    assert again.status_code == 404 and "not loaded" in again.json()["error"]["message"]
    http.put("/v1/models/preset", json={"model": GEMMA, "pinned": False, "ttl_s": 600})


@pytest.mark.parametrize("route, body", [
    ("/v1/models/unload", {}),
    ("/v1/models/unload", {"model": 3}),
    ("/v1/models/preset", {"model": GEMMA, "ttl_s": -1}),
    ("/v1/models/preset", {"model": "no-such-model", "pinned": True}),
    ("/v1/models/preset", {"model": "~nosuchuser0/model.gguf", "pinned": True}),
    ("/v1/models/preset", {"model": GEMMA, "ttl_s": 1e12}),
    ("/v1/models/load", {"model": GEMMA, "default": "perhaps"}),
])
def test_bad_fleet_requests_are_refused_with_a_clear_error(http, route, body):
    send = http.put if route.endswith("preset") else http.post
    reply = send(route, json=body)
    assert reply.status_code in (400, 404, 422), reply.text
    assert reply.json()["error"]["message"]
    assert STARTER in loaded(http)  # the engine serves on
