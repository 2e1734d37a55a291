"""No request can crash the engine or reach it from where it should not: schemas whose
grammar would overflow llama.cpp's parser are refused with a 400 naming the keyword,
bodies are capped before they are parsed, the Host must be ours (DNS rebinding), the API
schema and /docs are off unless asked for, /health tells strangers nothing; and a fuzz of
every route (schemathesis, from the engine's own OpenAPI schema) and of schemas and tool
lists (hypothesis) finds no 5xx and no death."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support import ROOT
from support.crafted import gguf_headers, one_bit_png
from support.engines import api_client, start_engine
from engine.conversation.json_schema import MAX_REPEAT, Branch, check, nesting, quantifiers
from engine.llama.grammar import grammar
from engine.api.server.guard import host_allowed
from engine.errors import InvalidRequest
from engine.api.server.serving import is_loopback

TINY = "tiny"
# examples per fuzz test (schemathesis: per route); HOMERACK_FUZZ_EXAMPLES=500 for a long run
EXAMPLES = int(os.environ.get("HOMERACK_FUZZ_EXAMPLES", "25"))


# -- schemas: bounded before any grammar is built ----------------------------------

@pytest.mark.parametrize("schema, param", [
    ({"type": "string", "maxLength": 50_000}, "s.maxLength"),
    ({"type": "string", "minLength": 10**9}, "s.minLength"),
    ({"type": "array", "items": {"type": "string", "maxLength": 2000}}, "s.items.maxLength"),
    ({"type": "array", "maxItems": 999_999_999}, "s.maxItems"),
    ({"type": "string", "pattern": "^a{1,100000}$"}, "s.pattern"),
    # the converter reads a count with int(): a sign, underscores, other scripts' digits
    ({"type": "string", "pattern": "^a{0,+70000}$"}, "s.pattern"),
    ({"type": "string", "pattern": "^a{0,7_0000}$"}, "s.pattern"),
    ({"type": "string", "pattern": "^a{+70000}$"}, "s.pattern"),
    ({"type": "string", "pattern": "^a{ 70000 ,}$"}, "s.pattern"),
    ({"type": "string", "pattern": "^a{\u0667\u0660\u0660\u0660\u0660}$"}, "s.pattern"),
    ({"type": "string", "pattern": "^(a|[}]){-70000,}$"}, "s.pattern"),
    ({"type": "string", "pattern": "^(ab){5000}$"}, "s.pattern"),
    ({"type": "string", "pattern": "^" + "a" * 5000 + "$"}, "s.pattern"),
    ({"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(300)}},
     "s.properties"),
])
def test_a_schema_that_would_overflow_the_grammar_parser_is_refused_naming_its_keyword(
        schema, param):
    for strict in (True, False):  # a tool's schema too, where other keywords are only noted
        with pytest.raises(InvalidRequest) as refused:
            check(schema, "s", strict=strict)
        assert refused.value.param == param


def test_deep_nesting_and_too_many_schemas_are_refused():
    deep = {"type": "string"}
    for _ in range(200):
        deep = {"type": "array", "items": deep}
    with pytest.raises(InvalidRequest, match="nested more than"):
        check(deep, "s")
    wide = {"type": "object", "properties": {
        f"p{i}": {"type": "array", "maxItems": 900, "items": {"type": "string", "maxLength": 900}}
        for i in range(20)}}
    with pytest.raises(InvalidRequest, match="too large"):
        check(wide, "s")


def test_quantifiers_are_read_as_the_converter_reads_them():
    assert quantifiers("a{2}b{0,+7}c{7_0}d{ 3 ,}") == [2, 0, 7, 70, 3]
    assert quantifiers("[{]{9}\\{8}") == [9]  # a class and an escaped brace are no quantifiers


def test_the_grammars_nesting_is_measured_outside_literals_and_bounded(monkeypatch):
    assert nesting('root ::= "((((" [(] ( ( x ) ) # (((\nx ::= "a"') == 2
    schema = {"type": "string", "pattern": "^a{0,100}$"}
    assert nesting(grammar([Branch(schema)], "s")) >= 100
    monkeypatch.setattr("engine.llama.grammar.MAX_NESTING", 50)
    with pytest.raises(InvalidRequest, match="nests"):
        grammar([Branch(schema)], "s")


_PARSE = """
import sys, threading
import llama_cpp as llama
llama.llama_backend_init()
model = llama.llama_model_load_from_file(sys.argv[1].encode(), llama.llama_model_default_params())
vocab = llama.llama_model_get_vocab(model)
text = sys.stdin.read()
result = {}
def parse():
    result["ok"] = bool(llama.llama_sampler_init_grammar(vocab, text.encode(), b"root"))
threading.stack_size(512 * 1024)  # macOS's default for threads: the smallest we meet
thread = threading.Thread(target=parse)
thread.start()
thread.join()
print("parsed" if result["ok"] else "refused")
"""


@pytest.mark.slow
@pytest.mark.parametrize("schema", [
    {"type": "string", "maxLength": MAX_REPEAT},
    {"type": "array", "items": {"type": "integer"}, "maxItems": MAX_REPEAT},
    {"type": "string", "pattern": f"^(ab){{0,{MAX_REPEAT}}}$"},
])
def test_the_largest_accepted_repetition_parses_on_a_small_thread_stack(schema, tiny_model):
    """In a child process: over the bound, the parser overflows this stack (SIGSEGV)."""
    check(schema, "s")
    parsed = subprocess.run([sys.executable, "-c", _PARSE, str(tiny_model)],
                            input=grammar([Branch(schema)], "s"), capture_output=True,
                            text=True, timeout=120)
    assert parsed.returncode == 0, f"the parser died: {parsed.returncode}"
    assert parsed.stdout.strip() == "parsed"


# -- hosts ----------------------------------------------------------------------------

@pytest.mark.parametrize("host, allowed", [
    ("localhost:8080", True), ("127.0.0.1:1234", True), ("[::1]:80", True),
    ("LOCALHOST", True), ("app.localhost:9", True), ("10.0.0.5:8000", True),
    ("evil.example:8080", False), ("localhost.evil.example", False), ("", False),
])
def test_only_loopback_names_and_addresses_may_address_the_engine(host, allowed):
    assert host_allowed(host) is allowed


def test_a_name_the_engine_serves_under_is_allowed_and_loopback_is_recognised():
    assert host_allowed("attic.lan:8000", frozenset({"attic.lan"}))
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")


# -- a real engine ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def fuzz_engine(home, tiny_model, tmp_path_factory):
    """A real engine on the tiny random model (fast to generate) with its API schema on,
    its own models folder (the starters linked, the tiny model beside them), and the test
    Hub (tests/support/hub_server.py, without repositories) as its Hub: no traffic leaves."""
    from support.hub_server import HubServer

    name = "fuzz"
    models = home / name / "data" / "models"
    models.mkdir(parents=True, exist_ok=True)
    for model in (home / "data" / "models").glob("*.gguf"):
        if not (models / model.name).exists():
            (models / model.name).symlink_to(model.resolve())
    shutil.copy(tiny_model, models / f"{TINY}.gguf")
    hub = HubServer({})
    os.environ["HF_ENDPOINT"] = hub.url
    try:
        process, address, _ = start_engine(
            home, name, ["--model", TINY, "--ctx", "256", "--api-docs", "--queue-size", "64"])
    finally:
        del os.environ["HF_ENDPOINT"]
    yield process, address
    process.stop()
    hub.close()


@pytest.fixture(scope="module")
def raw(fuzz_engine):
    with api_client(fuzz_engine[1]) as client:
        yield client


def assert_alive_and_answering(fuzz_engine, raw) -> None:
    process, _ = fuzz_engine
    assert process.process.poll() is None, "the engine died"
    reply = raw.post("/v1/completions", json={"model": TINY, "prompt": "the cat",
                                              "max_tokens": 4, "temperature": 0})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] >= 1


@pytest.mark.slow
def test_a_huge_repetition_in_a_schema_is_a_400_and_the_engine_lives(fuzz_engine, raw):
    huge = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 50_000}}}
    reply = raw.post("/v1/chat/completions", json={
        "model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": huge}}})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == \
        "response_format.json_schema.schema.properties.name.maxLength"
    # a tool's parameters are the agent's, not the answer's schema: a bound no grammar can
    # hold is left out of the grammar and reported (Claude Code's tools ask for strings of
    # 524,288 characters), never a grammar that crashes the engine
    tool = {"type": "function", "function": {"name": "f", "parameters": huge}}
    reply = raw.post("/v1/chat/completions", json={
        "model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "tools": [tool], "tool_choice": "required"})
    assert "maxLength" not in reply.text or "not enforced" in reply.text, reply.text
    signed = {"type": "string", "pattern": "^a{0,+70000}$"}  # a SIGSEGV before
    reply = raw.post("/v1/chat/completions", json={
        "model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": signed}}})
    assert reply.status_code == 400, reply.text
    assert_alive_and_answering(fuzz_engine, raw)


@pytest.mark.slow
def test_the_largest_accepted_repetition_generates_in_the_engine(fuzz_engine, raw):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": MAX_REPEAT}},
              "required": ["name"]}
    reply = raw.post("/v1/chat/completions", json={
        "model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}})
    assert reply.status_code == 200, reply.text
    assert reply.json()["choices"][0]["message"]["content"].startswith('{')


@pytest.mark.slow
def test_a_request_names_models_by_id_never_by_path(fuzz_engine, raw, tiny_model, home):
    """Whatever holds the token (an agent, a paired host) cannot make the engine open a
    file: paths are for the command line, whose user owns the files."""
    from support.models import ADAPTER

    outside = str(tiny_model)  # a real GGUF outside the models folder
    adapter = str((home / "data" / "models" / f"{ADAPTER}.gguf").resolve())
    chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    for body, param in [({"model": outside}, "model"), ({"model": "~/x.gguf"}, "model"),
                        ({"model": TINY, "draft_model": outside}, "draft_model"),
                        ({"model": f"{TINY}+{adapter}"}, "lora"),
                        ({"model": TINY, "lora": [{"id": adapter}]}, "lora")]:
        reply = raw.post("/v1/chat/completions", json=chat | body)
        assert reply.status_code == 404, (body, reply.text)
        assert reply.json()["error"]["param"] == param, (body, reply.text)
    for route, body in [("/v1/embeddings", {"model": outside, "input": "x"}),
                        ("/v1/plan", {"model": outside}), ("/v1/models/load", {"model": outside}),
                        ("/v1/models/import", {"path": outside})]:
        reply = raw.post(route, json=body)
        assert reply.status_code == 404, (route, reply.text)
    assert raw.put("/v1/routing", json={"small": outside, "large": TINY}).status_code == 404
    assert_alive_and_answering(fuzz_engine, raw)


def test_paths_are_resolved_only_when_the_command_line_asks(tiny_store, tiny_model):
    from engine.errors import ModelNotFound

    with pytest.raises(ModelNotFound):
        tiny_store.resolve(str(tiny_model))
    assert tiny_store.resolve(str(tiny_model), paths=True).path == tiny_model.resolve()
    assert tiny_store.resolve("tiny").id == "tiny"


def test_a_generation_only_engine_keeps_generation_the_model_list_and_health():
    """What a worker's replica engine serves paired hosts: no loading, no presets, no
    downloads with the owner's HF_TOKEN."""
    from types import SimpleNamespace

    from fastapi.testclient import TestClient

    from engine.api.server.factory import create_app
    from engine.api.admin.hub_routes import hub_routes

    hub = hub_routes(SimpleNamespace(folder=None), SimpleNamespace())
    app = create_app(SimpleNamespace(replicas=None), "t", routers=(hub,), generation_only=True)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        for method, path in [("PUT", "/v1/models/preset"), ("POST", "/v1/downloads"),
                             ("POST", "/v1/models/load"), ("GET", "/v1/hub/search"),
                             ("GET", "/metrics"), ("POST", "/v1/plan")]:
            refused = client.request(method, path, headers={"Authorization": "Bearer t"})
            assert refused.status_code == 404, (method, path)
            assert "generation" in refused.json()["error"]["message"]
        assert client.get("/v1/models").status_code == 401  # there, behind the token
        assert client.post("/v1/chat/completions", json={}).status_code == 401
        assert client.get("/health").json() == {"status": "ok"}


def test_a_workers_replica_engine_serves_generation_only(monkeypatch):
    from engine.cluster import worker

    started = []
    monkeypatch.setattr(worker.subprocess, "Popen", lambda args, **_kw: started.append(args))
    worker.ReplicaEngine(("--threads", "1"))._start()
    assert "--generation-only" in started[0]


@pytest.mark.slow
def test_bodies_over_the_cap_are_refused_before_the_token_or_parsing(fuzz_engine):
    _, address = fuzz_engine
    big = b'{"prompt": "' + b"a" * (17 << 20) + b'"}'
    with httpx.Client(base_url=address.url, timeout=60) as stranger:  # no token
        announced = stranger.post("/v1/completions", content=big,
                                  headers={"content-type": "application/json"})
        assert announced.status_code == 413
        assert "over 16 MiB" in announced.json()["error"]["message"]

        def chunks():  # no Content-Length: counted as it arrives
            for start in range(0, len(big), 1 << 20):
                yield big[start:start + (1 << 20)]
        streamed = stranger.post("/v1/messages", content=chunks(),
                                 headers={"content-type": "application/json",
                                          "x-api-key": address.token})
        assert streamed.status_code == 413
        assert streamed.json()["type"] == "error"  # in Anthropic's shape on its route


@pytest.mark.slow
def test_a_foreign_host_is_refused_and_docs_health_say_little(fuzz_engine, raw, server):
    _, address = fuzz_engine
    rebound = raw.get("/v1/models", headers={"Host": "evil.example"})
    assert rebound.status_code == 421
    assert raw.get("/v1/models", headers={"Host": "localhost"}).status_code == 200
    assert raw.get("/openapi.json").status_code == 200  # this engine was asked for it
    shared, _, _ = server  # the shared engine was not
    with httpx.Client(base_url=shared.url, timeout=30) as stranger:
        assert stranger.get("/openapi.json").status_code == 404
        assert stranger.get("/docs").status_code == 404
        assert stranger.get("/health").json() == {"status": "ok"}
        full = stranger.get("/health", headers={"Authorization": f"Bearer {shared.token}"})
        assert {"model", "load_error", "busy"} <= full.json().keys()


def test_serving_beyond_loopback_warns_that_the_token_travels_in_clear(tmp_path):
    """192.0.2.1 (TEST-NET-1) is no address of this machine: the bind fails after the
    warning, and nothing listens on the network."""
    env = dict(os.environ, HOMERACK_HOME=str(tmp_path))
    result = subprocess.run([sys.executable, "-m", "app", "serve", "--host", "192.0.2.1",
                             "--model", "none-such"], cwd=ROOT, env=env, capture_output=True,
                            text=True, timeout=120)
    assert "travel unencrypted" in result.stderr


# -- fuzz -------------------------------------------------------------------------------

_SCALARS = st.sampled_from(["string", "integer", "number", "boolean", "null", "object",
                            "array", "whatever"])
_COUNTS = st.one_of(st.integers(0, 3), st.integers(0, 10**12), st.just(-1), st.floats(allow_nan=False, allow_infinity=False),
                    st.text(max_size=3))
_LEAF = st.fixed_dictionaries({"type": _SCALARS}, optional={
    "maxLength": _COUNTS, "minLength": _COUNTS,
    "pattern": st.one_of(st.text(max_size=12), st.builds(
        "^a{{{}}}$".format, st.sampled_from(["+70000", "0,+70000", "7_0000", "0,7_0000",
                                             "\u0667\u0660\u0660\u0660\u0660", "-5,2",
                                             " 999 , 1000 ", "1_000"]))),
    "enum": st.lists(st.one_of(st.text(max_size=5), st.integers()), max_size=3),
    "format": st.sampled_from(["date", "uuid", "email", "x"])})
SCHEMAS = st.recursive(_LEAF, lambda inner: st.one_of(
    st.fixed_dictionaries({"type": st.just("object"), "properties": st.dictionaries(
        st.text(min_size=1, max_size=6), inner, max_size=4)},
        optional={"required": st.lists(st.text(max_size=6), max_size=3),
                  "additionalProperties": st.one_of(st.booleans(), inner)}),
    st.fixed_dictionaries({"type": st.just("array"), "items": inner},
                          optional={"maxItems": _COUNTS, "minItems": _COUNTS}),
    st.fixed_dictionaries({"anyOf": st.lists(inner, min_size=1, max_size=3)}),
    st.fixed_dictionaries({"$ref": st.sampled_from(["#/$defs/x", "http://x/y", "#"])}),
), max_leaves=12)


@pytest.mark.slow
@settings(max_examples=2 * EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(schema=SCHEMAS, as_tool=st.booleans(), stream=st.booleans())
def test_fuzzed_schemas_and_tools_get_a_2xx_or_4xx_never_a_crash(fuzz_engine, raw, schema,
                                                                 as_tool, stream):
    body = {"model": TINY, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
            "stream": stream}
    if as_tool:
        body |= {"tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}],
                 "tool_choice": "required"}
    else:
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "n", "schema": schema}}
    reply = raw.post("/v1/chat/completions", json=body)
    assert reply.status_code < 500, f"{reply.status_code}: {reply.text[:300]} for {json.dumps(schema)}"
    if reply.status_code >= 400:
        assert reply.json()["error"]["message"]
    elif stream:
        assert "data: [DONE]" in reply.text and '"error"' not in reply.text, reply.text[-300:]


_PICTURE_BYTES = st.one_of(
    st.binary(max_size=2048),
    st.builds(one_bit_png, st.sampled_from([1, 64, 7000])),  # 14 KB of 49 megapixels
    st.builds(lambda side, cut: one_bit_png(side)[:cut], st.sampled_from([64, 7000]),
              st.integers(8, 400)))


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(pictures=st.lists(_PICTURE_BYTES, min_size=1, max_size=20),
       route=st.sampled_from(["openai", "anthropic", "ollama"]))
def test_fuzzed_pictures_get_a_2xx_or_4xx_never_a_crash(fuzz_engine, raw, pictures, route):
    """Any bytes as pictures, any number of them, in each API's shape, to a model that
    cannot see: a 4xx, the engine alive and answering."""
    import base64

    encoded = [base64.b64encode(p).decode() for p in pictures]
    if route == "openai":
        reply = raw.post("/v1/chat/completions", json={"model": TINY, "max_tokens": 2, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "what is it?"}, *[
                {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{e}"}}
                for e in encoded]]}]})
    elif route == "anthropic":
        reply = raw.post("/v1/messages", json={"model": TINY, "max_tokens": 2, "messages": [
            {"role": "user", "content": [*[{"type": "image", "source": {
                "type": "base64", "media_type": "image/png", "data": e}} for e in encoded],
                {"type": "text", "text": "what is it?"}]}]})
    else:
        reply = raw.post("/api/generate", json={"model": TINY, "prompt": "what is it?",
                                                "images": encoded, "stream": False})
    assert 400 <= reply.status_code < 500, f"{route}: {reply.status_code} {reply.text[:300]}"
    assert fuzz_engine[0].process.poll() is None


@pytest.mark.slow
@settings(max_examples=EXAMPLES, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(header=gguf_headers())
def test_fuzzed_gguf_headers_in_the_models_folder_are_listed_never_a_crash(fuzz_engine, raw,
                                                                          home, header):
    """A file of any header dropped among the models: the list answers with it unreadable
    (or a model), a chat naming it is a 4xx, the engine alive."""
    path = home / "fuzz" / "data" / "models" / "fuzzed.gguf"
    path.write_bytes(header)
    try:
        listed = raw.get("/v1/models")
        assert listed.status_code == 200, listed.text[:300]
        chat = raw.post("/v1/chat/completions", json={
            "model": "fuzzed", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert chat.status_code < 500, chat.text[:300]
        assert fuzz_engine[0].process.poll() is None
    finally:
        path.unlink()


@pytest.mark.slow
def test_every_route_answers_fuzzed_requests_with_a_2xx_or_4xx(fuzz_engine):
    """Requests generated by schemathesis from the engine's own OpenAPI schema (the
    OpenAI, Anthropic, Responses and Ollama shapes included), route by route, with no 5xx."""
    process, address = fuzz_engine
    auth = {"Authorization": f"Bearer {address.token}"}
    schema = schemathesis.openapi.from_url(f"{address.url}/openapi.json", headers=auth)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 20  # every route is in the schema

    for operation in operations:
        @settings(max_examples=EXAMPLES, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy())
        def answers(case):
            response = case.call(headers=auth, timeout=120)
            assert response.status_code < 500, \
                f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}"
            assert process.process.poll() is None, f"the engine died on {case.method} {case.path}"
        answers()


_WRONG_SHAPES = [[], "text", 7, None, {"messages": "hi"}, {"messages": [1, [2]]},
                 {"messages": [{"role": 5, "content": {"x": 1}}]}, {"model": ["a"], "prompt": {}},
                 {"model": {"$ne": 1}, "input": [[[]]]}, {"prompt": "x", "max_tokens": "many"},
                 {"model": "../../etc/passwd", "prompt": "x"}, {"model": "/dev/zero", "input": "x"},
                 {"model": "~root/.ssh/id_rsa+x", "messages": [{"role": "user", "content": "x"}]},
                 {"messages": [{"role": "user", "content": "x"}], "lora": [{"id": "/etc/hosts"}]},
                 {"small": ["x"], "large": None}, {"path": "/etc/passwd"}, {"repo": 5, "quant": []}]
_ROUTES = [("POST", "/v1/chat/completions"), ("POST", "/v1/completions"), ("POST", "/v1/messages"),
           ("POST", "/v1/responses"), ("POST", "/v1/embeddings"), ("POST", "/v1/plan"),
           ("POST", "/v1/models/load"), ("PUT", "/v1/models/preset"), ("PUT", "/v1/routing"),
           ("POST", "/v1/downloads"), ("POST", "/tokenize"), ("PUT", "/v1/sources"),
           ("POST", "/api/chat"), ("POST", "/api/generate"), ("POST", "/api/embed"),
           ("POST", "/api/embeddings"), ("POST", "/api/show")]


@pytest.mark.slow
def test_json_of_the_wrong_shape_and_paths_for_ids_are_4xx_on_every_route(fuzz_engine, raw):
    for method, route in _ROUTES:
        for body in _WRONG_SHAPES:
            reply = raw.request(method, route, json=body)
            assert 400 <= reply.status_code < 500, f"{method} {route} {body}: {reply.text[:200]}"
    assert_alive_and_answering(fuzz_engine, raw)


@pytest.mark.slow
def test_the_engine_answers_normally_after_the_fuzz(fuzz_engine, raw):
    assert_alive_and_answering(fuzz_engine, raw)
