"""The fifth hardening round (issue 80) through a real `homerack serve` with the tokenless
Ollama door on: a lone surrogate in any text field of any wire format is a 400 naming the
field while the owner's answer streams on untouched; tool schemas of requests that fail
keep nothing; conversations of 40,000 calls build in linear time; the door is a client of
its own (none of the owner's cached prompts or answers, no documents) and refuses web
pages of other origins."""

from __future__ import annotations

import copy
import json
import threading
import time

import httpx
import psutil
import pytest

from support.engines import api_client, models_once_read, start_engine
from support.models import STARTER, linked_models

pytestmark = pytest.mark.slow
TINY = "tiny"
LONE = "x \ud800"
OWNER_STREAM = {"model": STARTER, "max_tokens": 48, "temperature": 0, "ignore_eos": True,
                "stream": True, "messages": [{"role": "user", "content": "Tell me a story."}]}


@pytest.fixture(scope="module")
def served(tmp_path_factory, starters_dir, tiny_model, door_port):
    home = tmp_path_factory.mktemp("hardening5")
    linked_models(home, starters_dir, tiny_model)  # tiny.gguf: "tiny"
    notes = home / "notes"
    notes.mkdir()
    (notes / "locker.md").write_text("The locker code is 5531. It opens the blue locker.\n")
    process, address, _ = start_engine(home, "hardening5", [
        "--model", STARTER, "--ctx", "2048", "--parallel", "4", "--response-cache-mib", "64",
        "--ollama-port", str(door_port)])
    with api_client(address) as http:
        models_once_read(http)
        added = http.post("/v1/collections", json={"name": "notes", "paths": [str(notes)]})
        assert added.status_code == 200, added.text
        with httpx.Client(base_url=f"http://127.0.0.1:{door_port}", timeout=120) as door:
            yield process, http, door
    process.stop()


def _post(client, path: str, body: dict) -> httpx.Response:
    """The body as a JavaScript client sends it: JSON with its lone surrogates escaped."""
    return client.post(path, content=json.dumps(body).encode(),
                       headers={"Content-Type": "application/json"})


def _strings(value, where=""):
    """Every string of a body, with its place as the guard names it."""
    if isinstance(value, str):
        yield where
    elif isinstance(value, dict):
        for key, inner in value.items():
            yield from _strings(inner, f"{where}.{key}" if where else key)
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _strings(inner, f"{where}[{i}]")


def _with_lone(body: dict, where: str) -> dict:
    out = copy.deepcopy(body)
    path = where.replace("]", "").replace("[", ".").split(".")
    inner = out
    for step in path[:-1]:
        inner = inner[int(step)] if isinstance(inner, list) else inner[step]
    last = path[-1]
    if isinstance(inner, list):
        inner[int(last)] = LONE
    else:
        inner[last] = LONE
    return out


TOOL = {"type": "function", "function": {"name": "weather", "description": "The weather",
                                         "parameters": {"type": "object", "properties": {
                                             "city": {"type": "string"}}}}}
BODIES = {  # (door?, path, a valid body of that route)
    "chat": (False, "/v1/chat/completions", {
        "model": STARTER, "max_tokens": 2, "stop": ["\n\n"], "grammar": 'root ::= "a"',
        "messages": [{"role": "system", "content": "Be brief."},
                     {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
                     {"role": "assistant", "content": "", "tool_calls": [{
                         "id": "c1", "type": "function",
                         "function": {"name": "weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                     {"role": "tool", "tool_call_id": "c1", "content": "Sunny"}],
        "tools": [TOOL]}),
    "completions": (False, "/v1/completions", {"model": STARTER, "prompt": "Once upon",
                                               "max_tokens": 2, "suffix": "end"}),
    "messages": (False, "/v1/messages", {
        "model": STARTER, "max_tokens": 2, "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "tools": [{"name": "weather", "description": "The weather", "input_schema": {
            "type": "object", "properties": {"city": {"type": "string"}}}}]}),
    "responses": (False, "/v1/responses", {
        "model": STARTER, "max_output_tokens": 16, "instructions": "Be brief.",
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]}]}),
    "embeddings": (False, "/v1/embeddings", {"model": "all-minilm-l6-v2-f16",
                                             "input": ["a sentence"]}),
    "ollama chat": (True, "/api/chat", {
        "model": STARTER, "stream": False, "options": {"num_predict": 2},
        "messages": [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": "", "tool_calls": [
                         {"function": {"name": "weather", "arguments": {"city": "Oslo"}}}]},
                     {"role": "tool", "tool_name": "weather", "content": "Sunny"}]}),
    "ollama generate": (True, "/api/generate", {"model": STARTER, "prompt": "hi",
                                                "system": "Be brief.", "stream": False}),
    "ollama embed": (True, "/api/embed", {"model": "all-minilm-l6-v2-f16", "input": "hi"}),
    "door chat": (True, "/v1/chat/completions", {
        "model": STARTER, "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}),
}


def test_a_lone_surrogate_in_any_text_field_is_a_400_naming_it_and_the_owner_streams_on(
        served):
    process, http, door = served
    alone = _stream(http)
    streamed: dict = {}
    owner = threading.Thread(target=lambda: streamed.update(_stream(http)))
    owner.start()
    refused = 0
    for name, (through_door, path, body) in BODIES.items():
        client = door if through_door else http
        for where in _strings(body):
            reply = _post(client, path, _with_lone(body, where))
            assert reply.status_code == 400, (name, where, reply.text)
            error = reply.json()["error"]
            message = error if isinstance(error, str) else error["message"]
            assert message.startswith(f"{where}:") and "surrogate" in message, message
            if isinstance(error, dict):
                assert error.get("param") == where
            refused += 1
    owner.join(120)
    assert refused > 40
    assert streamed == alone  # the same 48 tokens, to the end
    assert process.process.poll() is None
    assert _post(door, "/api/chat", {**BODIES["ollama chat"][2], "messages": [
        {"role": "user", "content": "hi \ud83d\ude00"}]}).status_code == 200  # a pair is text


def _stream(http) -> dict:
    text, reason = "", None
    with http.stream("POST", "/v1/chat/completions", json=OWNER_STREAM,
                     headers={"Cache-Control": "no-store"}) as reply:
        assert reply.status_code == 200
        for line in reply.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"]
                if choice:
                    text += choice[0]["delta"].get("content") or ""
                    reason = choice[0].get("finish_reason") or reason
    return {"text": text, "finish_reason": reason}


def test_tool_schemas_of_requests_that_fail_keep_nothing(served):
    """Eight 10 MiB tool schemas naming a model that does not exist (404 each): the
    engine keeps none of them (it kept each, 470 MiB for one of 13.6 MiB)."""
    process, http, door = served
    engine = psutil.Process(process.process.pid)
    schema = {"type": "object", "description": "d" * (10 << 20),
              "properties": {"q": {"type": "string"}}}
    before = engine.memory_info().rss
    for i in range(8):
        reply = _post(door, "/api/chat", {"model": "no-such-model", "stream": False,
                                          "messages": [{"role": "user", "content": "hi"}],
                                          "tools": [{"type": "function", "function": {
                                              "name": f"t{i}", "parameters": schema}}]})
        assert reply.status_code == 404, reply.text
    time.sleep(0.5)
    grew = engine.memory_info().rss - before
    assert grew < 80 << 20, f"grew {grew >> 20} MiB"


def test_forty_thousand_calls_build_in_linear_time(served):
    """An assistant message of 40,000 calls and 40,000 results, through each format (one
    such body from the door took 187 s of CPU, six held the owner's one-token chat past a
    minute): each answered in seconds, refused for the context it would take."""
    process, http, door = served
    n = 40_000
    bodies = [
        (door, "/api/chat", {"model": STARTER, "stream": False, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"function": {"name": f"f{i}", "arguments": {}}} for i in range(n)]},
            *({"role": "tool", "tool_name": "none of them", "content": "ok"}
              for _ in range(n))]}),
        (http, "/v1/chat/completions", {"model": STARTER, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": f"c{i}", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                for i in range(n)]},
            *({"role": "tool", "tool_call_id": f"c{n - 1 - i}", "content": "ok"}
              for i in range(n))]}),
        (http, "/v1/messages", {"model": STARTER, "max_tokens": 2, "messages": [
            {"role": "user", "content": "hi"},
            *({"role": "system", "content": "a reminder " * 8} for _ in range(n))]}),
        (http, "/v1/responses", {"model": STARTER, "input": [
            *({"type": "reasoning", "summary": [{"type": "summary_text",
                                                 "text": "a thought " * 8}]}
              for _ in range(n)), {"role": "user", "content": "hi"}]}),
    ]
    for client, path, body in bodies:
        started = time.monotonic()
        reply = client.post(path, json=body)
        took = time.monotonic() - started
        # the reasoning joins one answer the template leaves out: that one answers
        assert reply.status_code == 200 if path == "/v1/responses" else \
            reply.status_code == 400 and "context" in reply.text, (path, reply.text[:300])
        assert took < 20, f"{path}: {took:.1f} s"  # quadratic: minutes


def test_the_ollama_door_is_a_client_of_its_own(served):
    """A program on this computer reads neither the owner's cached prompt (KV, prompt
    cache) nor the owner's cached answer, nor the owner's documents."""
    process, http, door = served
    secret = {"model": STARTER, "max_tokens": 1, "temperature": 0,
              "messages": [{"role": "user", "content": "The locker code is 7702. Say it."}]}
    for _ in range(2):  # held in KV and in the response cache
        assert http.post("/v1/chat/completions", json=secret).status_code == 200
    guess = {**secret, "messages": [{"role": "user", "content": "The locker code is 1234. "
                                     "Say it."}]}
    for ask in (guess, secret):  # each shares with the door's own guess only
        reply = door.post("/v1/chat/completions", json=ask).json()
        assert reply["homerack"].get("response_cache") != "hit"
    usage = reply["usage"]
    # the owner's cells would give all but the last token; the guess's stop at the code
    assert usage["prompt_tokens_details"]["cached_tokens"] < usage["prompt_tokens"] - 4, usage
    again = door.post("/v1/chat/completions", json=secret).json()  # its own are its own
    assert again["homerack"].get("response_cache") == "hit"
    grounded = door.post("/api/chat", json={**BODIES["ollama chat"][2], "messages": [
        {"role": "user", "content": "What is the locker code?"}], "collections": ["notes"]})
    assert grounded.status_code == 403, grounded.text
    assert "5531" not in grounded.text and "locker.md" not in grounded.text


def test_the_door_refuses_web_pages_of_other_origins(served):
    process, http, door = served
    ask = {"model": STARTER, "prompt": "hi", "stream": False, "options": {"num_predict": 1}}
    evil = door.post("/api/generate", json=ask, headers={"Origin": "https://evil.example"})
    assert evil.status_code == 403 and "origin" in evil.json()["error"]
    unload = door.post("/api/generate", json={"model": STARTER, "keep_alive": 0},
                       headers={"Origin": "https://evil.example"})
    assert unload.status_code == 403
    assert any(m["name"] == STARTER for m in door.get("/api/ps").json()["models"])
    for origin in ("http://localhost:3000", "http://127.0.0.1:8080", "app://obsidian.md",
                   "vscode-webview://abc"):
        assert door.post("/api/generate", json=ask,
                         headers={"Origin": origin}).status_code == 200, origin
    assert door.post("/api/generate", json=ask).status_code == 200  # a program: no Origin
