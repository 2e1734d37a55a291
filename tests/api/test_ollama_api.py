"""Moving in: a real `homerack serve` on a machine whose other apps hold models (Ollama's
manifests and blobs, the Hub cache's snapshot links, LM Studio's tree, built around the
starters), and the apps that speak Ollama's API, through the official `ollama` client:
the models found, each once, loaded and chatted with where they lie; a tool call; text
generation; embeddings; keep_alive; files that appear while the engine runs."""

from __future__ import annotations

import json
import socket
import time

import httpx
import ollama
import pytest

from fixtures.other_apps import hub_cache_model, ollama_model, tree_model
from support.agent_templates import HERMES
from support.engines import api_client, models_once_read, start_engine
from support.models import PARIS_QUESTION, STARTER, with_template
from tiny_gguf import CHATML

pytestmark = pytest.mark.slow

GEMMA, EMBEDDER = "gemma-3-270m-q4_k_m", "all-minilm-l6-v2-f16"
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather forecast for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


@pytest.fixture(scope="module")
def machine(tmp_path_factory, starters_dir):
    """A home whose Ollama, Hub cache and LM Studio hold models: the starter chat model
    (also Homerack's own: one model), a copy of it speaking Hermes' tool calls with
    Ollama's parameters and system prompt, Gemma in the Hub cache, the embedder copied
    into LM Studio, and an Ollama manifest that is not JSON."""
    home = tmp_path_factory.mktemp("machine")
    tools = with_template(starters_dir / f"{STARTER}.gguf", home / "smol-tools.gguf", HERMES)
    ollama = home / ".ollama" / "models"
    ollama_model(ollama, tools, "smol-tools", params={"temperature": 0, "stop": ["<|im_end|>"],
                                                      "num_ctx": 1024},
                 system="You are a helpful assistant.")
    ollama_model(ollama, starters_dir / f"{STARTER}.gguf", "smollm2", "135m")
    ollama_model(ollama, tools, "broken").write_text("{ not json")
    hub_cache_model(home / ".cache" / "huggingface" / "hub", starters_dir / f"{GEMMA}.gguf",
                    "unsloth/gemma-3-270m-it-GGUF", "gemma-3-270m-it-Q4_K_M.gguf")
    hub_cache_model(home / ".cache" / "huggingface" / "hub", with_template(  # only there
        starters_dir / f"{STARTER}.gguf", home / "smol-chatml.gguf", CHATML),
        "someone/Smol-ChatML-GGUF", "smol-chatml-Q4_1.gguf")
    tree_model(home / ".lmstudio" / "models", starters_dir / f"{EMBEDDER}.gguf",
               "second-state/MiniLM-GGUF/all-MiniLM-L6-v2-F16.gguf", copy=True)
    return home


@pytest.fixture(scope="module")
def engine(home, machine, door_port):
    env = {"HOME": str(machine), "HOMERACK_MODEL_SOURCES": ""}
    process, address, _ = start_engine(home, "moving-in", [
        "--ctx", "2048", "--ollama-port", str(door_port)], env)
    yield address
    process.stop()


@pytest.fixture(scope="module")
def client(engine):
    return ollama.Client(host=engine.url, headers={"Authorization": f"Bearer {engine.token}"},
                         timeout=120)


def models_of(engine) -> dict[str, dict]:
    with api_client(engine) as http:
        return {m["id"]: m for m in http.get("/v1/models").json()["data"]}


def inspected(engine) -> dict[str, dict]:
    """The list once every model's header is read (the engine reads them in the background)."""
    with api_client(engine) as http:
        return models_once_read(http)


def test_the_models_of_other_apps_are_listed_once_with_where_they_live(engine):
    models = inspected(engine)
    assert models["smol-tools:latest"]["source"] == "ollama"
    assert models["smol-tools:latest"]["sampling_defaults"]["source"] == \
        "the parameters Ollama keeps for it"
    assert models[STARTER]["also_at"] == ["Ollama: smollm2:135m"]  # the same blob: one model
    assert models[GEMMA]["also_at"] == [
        "the Hugging Face cache: unsloth/gemma-3-270m-it-GGUF/gemma-3-270m-it-Q4_K_M.gguf"]
    assert models[EMBEDDER]["also_at"] == [  # a copy: the same content
        "LM Studio: second-state/MiniLM-GGUF/all-MiniLM-L6-v2-F16.gguf"]
    broken = models["broken:latest"]
    assert broken["kind"] == "unreadable" and "not readable JSON" in broken["problem"]


def test_the_ollama_client_lists_shows_and_chats(client):
    names = {m.model for m in client.list().models}
    assert {"smol-tools:latest", STARTER, GEMMA, EMBEDDER} <= names
    assert "broken:latest" not in names
    shown = client.show("smol-tools")
    assert "tools" in shown.capabilities and "temperature 0" in shown.parameters
    # by its name in Ollama, whole and streamed (greedy: the question's margin is measured)
    ask = dict(model="smollm2:135m", messages=[{"role": "user", "content": PARIS_QUESTION}],
               options={"temperature": 0, "num_predict": 24})
    whole = client.chat(**ask, stream=False)
    assert "Paris" in whole.message.content and whole.done and whole.eval_count <= 24
    parts = list(client.chat(**ask, stream=True))
    assert parts[-1].done and parts[-1].done_reason in ("stop", "length")
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert any(m.model == STARTER and m.context_length == 2048 for m in client.ps().models)


def test_a_tool_call_and_its_result_through_the_ollama_client(client):
    """Three earlier calls shown, the model calls for the fourth city (its first token,
    "<" of <tool_call>, leads by 6.4 logits, measured); its result goes back and the
    model answers in words."""
    history = []
    for city in ("Paris", "Rome", "Oslo"):
        history += [{"role": "user", "content": f"What's the weather in {city}?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"function": {"name": "get_weather", "arguments": {"city": city}}}]}]
    asked = history + [{"role": "user", "content": "What's the weather in Tokyo?"}]
    reply = client.chat(model="smol-tools", messages=asked, tools=[WEATHER], stream=False,
                        options={"num_predict": 40})
    [call] = reply.message.tool_calls
    assert call.function.name == "get_weather"
    held = {m.model: m.context_length for m in client.ps().models}
    assert held["smol-tools:latest"] == 1024  # the num_ctx its Ollama parameters give
    assert isinstance(call.function.arguments["city"], str)
    answered = asked + [reply.message, {"role": "tool", "tool_name": "get_weather",
                                        "content": "sunny, 21 C"}]
    after = client.chat(model="smol-tools", messages=answered, tools=[WEATHER],
                        stream=False, options={"num_predict": 20})
    assert after.done and (after.message.content or after.message.tool_calls)


def test_a_model_only_in_the_hub_cache_loads_and_answers_where_it_lies(client, engine):
    entry = inspected(engine)["smol-chatml-Q4_1"]
    assert entry["source"] == "huggingface" and entry["path"].endswith(
        "snapshots/0123456789abcdef0123456789abcdef01234567/smol-chatml-Q4_1.gguf")
    reply = client.chat(model="someone/Smol-ChatML-GGUF/smol-chatml-Q4_1.gguf", stream=False,
                        messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 4})
    assert reply.done and reply.eval_count <= 4


def test_generate_raw_templated_and_structured(client):
    raw = client.generate(model=GEMMA, prompt="The capital of France is", raw=True,
                          options={"temperature": 0, "num_predict": 8})
    assert raw.response and raw.eval_count <= 8
    streamed = list(client.generate(model="smollm2:135m", prompt=PARIS_QUESTION, stream=True,
                                    options={"temperature": 0, "num_predict": 24}))
    assert "Paris" in "".join(p.response for p in streamed) and streamed[-1].done
    schema = {"type": "object", "properties": {"capital": {"type": "string", "maxLength": 20}},
              "required": ["capital"]}
    shaped = client.generate(model=STARTER, prompt=PARIS_QUESTION, format=schema,
                             options={"num_predict": 40})
    assert isinstance(json.loads(shaped.response)["capital"], str)


def test_embeddings_through_both_routes(client):
    vectors = client.embed(model=EMBEDDER, input=["a cat sat", "the stock market"]).embeddings
    assert len(vectors) == 2 and len(vectors[0]) == 384
    single = client.embeddings(model=EMBEDDER, prompt="a cat sat").embedding
    assert max(abs(a - b) for a, b in zip(single, vectors[0])) < 1e-4


def test_num_ctx_reloads_keep_alive_zero_unloads_and_a_load_answers_load(client):
    loaded = client.generate(model=GEMMA, prompt="")
    assert loaded.done_reason == "load"
    assert {m.model: m.context_length for m in client.ps().models}[GEMMA] == 2048
    client.generate(model=GEMMA, prompt="Hi", options={"num_ctx": 768, "num_predict": 1})
    assert {m.model: m.context_length for m in client.ps().models}[GEMMA] == 768
    assert client.generate(model=GEMMA, prompt="", keep_alive=0).done_reason == "unload"
    assert GEMMA not in {m.model for m in client.ps().models}


def test_bad_requests_get_ollamas_error_shape(engine, client):
    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="nope:7b", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.status_code == 404 and "nope:7b" in missing.value.error
    with pytest.raises(ollama.ResponseError) as broken:
        client.chat(model="broken", messages=[{"role": "user", "content": "hi"}])
    assert broken.value.status_code == 400 and "not readable JSON" in broken.value.error
    with pytest.raises(ollama.ResponseError) as image:
        client.chat(model=STARTER, messages=[{"role": "user", "content": "hi",
                                              "images": ["aGVsbG8="]}])
    assert image.value.status_code == 400 and "images" in image.value.error
    with pytest.raises(ollama.ResponseError) as keep:
        client.chat(model=STARTER, messages=[{"role": "user", "content": "hi"}],
                    keep_alive="soon")
    assert keep.value.status_code == 400 and "keep_alive" in keep.value.error
    with pytest.raises(ollama.ResponseError) as pull:
        client.pull("llama3")
    assert pull.value.status_code == 501
    bare = httpx.get(f"{engine.url}/api/tags")  # the token is needed here as everywhere
    assert bare.status_code == 401 and "token" in bare.json()["error"]


def test_files_that_appear_are_listed_with_their_kind_within_seconds(engine, machine,
                                                                     starters_dir, home):
    from fixtures.adapter_files import LoraSpec, write_lora

    ollama_model(machine / ".ollama" / "models", starters_dir / f"{GEMMA}.gguf",
                 "gemma3", "270m")  # a download finishing in Ollama: its manifest last
    adapter = home / "moving-in" / "data" / "models" / "fresh-adapter.gguf"
    write_lora(starters_dir / f"{STARTER}.gguf", adapter.with_suffix(".tmp"),
               LoraSpec(targets=("attn_q",), layers=(0,), strength=0.1))
    try:
        adapter.with_suffix(".tmp").rename(adapter)  # dropped into Homerack's own folder
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            models = models_of(engine)
            if models.get("fresh-adapter", {}).get("kind") == "adapter" and \
                    "Ollama: gemma3:270m" in models[GEMMA]["also_at"]:
                break
            time.sleep(0.5)
    finally:
        adapter.unlink()  # the folder is the other tests' too
    assert models["fresh-adapter"]["kind"] == "adapter"
    assert "Ollama: gemma3:270m" in models[GEMMA]["also_at"]


def test_the_tokenless_door_serves_ollamas_routes_only_on_loopback(engine, door_port):
    """`serve --ollama-port`: apps that cannot send a token (Ollama's own port); nothing
    but Ollama's routes and the OpenAI-compatible /v1 Ollama serves beside them (Codex's
    --oss probes it), never the owner's, and only to requests addressed to this machine."""
    open_door = ollama.Client(host=f"http://127.0.0.1:{door_port}", timeout=60)
    assert STARTER in {m.model for m in open_door.list().models}
    reply = open_door.chat(model=STARTER, messages=[{"role": "user", "content": "Hi"}],
                           options={"num_predict": 3})
    assert reply.done
    assert httpx.get(f"http://127.0.0.1:{door_port}/").text == "Ollama is running"
    listed = httpx.get(f"http://127.0.0.1:{door_port}/v1/models").json()
    assert STARTER in {m["id"] for m in listed["data"]}
    chat = httpx.post(f"http://127.0.0.1:{door_port}/v1/chat/completions", json={
        "model": STARTER, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]})
    assert chat.status_code == 200, chat.text
    mcp = httpx.post(f"http://127.0.0.1:{door_port}/v1/responses", json={
        "model": STARTER, "input": "Hi", "tools": [{"type": "mcp", "server_label": "x",
                                                    "server_url": "http://127.0.0.1:9/mcp"}]})
    assert mcp.status_code == 403  # the owner's MCP servers are the owner's API's
    assert httpx.post(f"http://127.0.0.1:{door_port}/v1/models/unload",
                      json={"model": STARTER}).status_code in (404, 405)
    for path in ("/v1/sources", "/v1/home", "/v1/hardware"):
        assert httpx.get(f"http://127.0.0.1:{door_port}{path}").status_code == 404, path
    rebound = httpx.get(f"http://127.0.0.1:{door_port}/api/tags",
                        headers={"Host": "attacker.example:11434"})
    assert rebound.status_code == 421 and "error" in rebound.json()


def test_a_taken_port_leaves_the_engine_serving_without_the_door(capsys):
    from engine.api.server.serving import _ollama_door

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        assert _ollama_door(None, taken.getsockname()[1]) is None
    assert "is Ollama running?" in capsys.readouterr().err
