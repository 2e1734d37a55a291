"""Logits that are not numbers, through a real `homerack serve` and the official clients.

Two copies of the tiny random model, each with NaN written into its weights: one whose
output projection is NaN (every logit of every step is NaN), and one whose embeddings of
the letter z are NaN (a sequence goes bad only once a z enters it: the sequences beside it
in the same batch stay finite). Greedy, sampled, with a grammar, with drafts, streamed or
not: the request ends with a model_error naming the model, the device and the token
position, never an IndexError or text sampled from garbage; a healthy request in the same
step finishes; nothing of it is cached; /metrics counts it."""

from __future__ import annotations

import threading

import openai
import pytest

from support.engines import api_client, start_engine
from support.models import with_nan_rows
from fixtures.network import sse_events

HEALTHY, ALL_NAN, Z_NAN = "tiny", "nan-output", "nan-z"
Z_TOKENS = ("z", "<0x7A>")  # every token whose text holds a z (the tiny vocabulary's)
ASK = [{"role": "user", "content": "the cat is on the mat"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model):
    home = tmp_path_factory.mktemp("nan")
    models = home / "data" / "models"
    models.mkdir(parents=True)
    (models / f"{HEALTHY}.gguf").symlink_to(tiny_model)
    with_nan_rows(tiny_model, models / f"{ALL_NAN}.gguf", "output.weight")
    with_nan_rows(tiny_model, models / f"{Z_NAN}.gguf", "token_embd.weight", Z_TOKENS)
    process, address, _ = start_engine(home, "nan", [
        "--model", HEALTHY, "--ctx", "512", "--parallel", "2", "--response-cache-mib", "16"])
    with api_client(address) as http:
        yield address, http
    process.stop()


@pytest.fixture(scope="module")
def client(served):
    address, _ = served
    return openai.OpenAI(base_url=f"{address.url}/v1", api_key=address.token, max_retries=0)


def _model_error(error: openai.APIStatusError, model: str) -> str:
    assert error.status_code == 500
    body = error.body if isinstance(error.body, dict) else {}
    assert body.get("type") == "model_error", error.body
    message = body["message"]
    assert f"{model}.gguf" in message and "NaN" in message
    assert "the CPU" in message and "position" in message
    return message


@pytest.mark.parametrize("how", [
    {"temperature": 0},
    {"temperature": 0.8, "seed": 3},
    {"temperature": 0, "extra_body": {"grammar": 'root ::= "yes" | "no"'}},
    {"temperature": 0.8, "extra_body": {"grammar": 'root ::= [a-y]+'}},
    {"temperature": 0, "extra_body": {"speculation": "lookup"}},
    {"temperature": 0, "frequency_penalty": 0.5},
], ids=["greedy", "sampled", "grammar", "sampled-grammar", "drafts", "penalties"])
def test_nan_logits_are_a_model_error_in_every_sampling_path(client, how):
    with pytest.raises(openai.InternalServerError) as raised:
        client.chat.completions.create(model=ALL_NAN, messages=ASK, max_tokens=8, **how)
    message = _model_error(raised.value, ALL_NAN)
    assert "position 1" in message or "position" in message


def test_a_stream_that_fails_before_its_first_token_is_an_http_error(client):
    with pytest.raises(openai.InternalServerError) as raised:
        for _ in client.chat.completions.create(model=ALL_NAN, messages=ASK, max_tokens=8,
                                                stream=True):
            pass
    _model_error(raised.value, ALL_NAN)


def _stream(http, grammar: str, out: dict, key: str) -> None:
    """A streamed chat whose output the grammar forces; its chunks and error, if any."""
    chunks, error, reasons = [], None, []
    with http.stream("POST", "/v1/chat/completions", json={
            "model": Z_NAN, "messages": ASK, "max_tokens": 60, "temperature": 0,
            "grammar": grammar, "stream": True}) as reply:
        for payload in sse_events(reply):
            if "error" in payload:
                error = payload["error"]
                continue
            for choice in payload.get("choices", []):
                chunks.append(choice["delta"].get("content") or "")
                if choice.get("finish_reason"):
                    reasons.append(choice["finish_reason"])
    out[key] = ("".join(chunks), error, reasons)


def test_a_sequence_gone_bad_midway_ends_alone_and_the_others_of_its_step_go_on(served):
    _, http = served
    out: dict = {}
    healthy = threading.Thread(target=_stream, args=(
        http, 'root ::= "abcdefgh" "abcdefgh" "abcdefgh" "abcdefgh"', out, "healthy"))
    bad = threading.Thread(target=_stream, args=(http, 'root ::= "abab" "z" "abab"', out,
                                                 "bad"))
    healthy.start()
    bad.start()
    healthy.join(120)
    bad.join(120)
    text, error, reasons = out["bad"]
    assert text.startswith("abab") and "z" in text  # streamed up to the poisoned token
    assert error and error["type"] == "model_error" and f"{Z_NAN}.gguf" in error["message"]
    assert reasons == ["error"]
    text, error, reasons = out["healthy"]
    assert error is None and text == "abcdefgh" * 4 and reasons == ["stop"]


def test_nothing_of_a_failed_answer_is_cached_and_metrics_count_it(served, client):
    _, http = served
    before = _counted(http)
    for _ in range(2):  # a second try meets the same error: no cached answer, no cached state
        with pytest.raises(openai.InternalServerError):
            client.chat.completions.create(model=ALL_NAN, messages=ASK, max_tokens=4,
                                           temperature=0)
    assert _counted(http) >= before + 2
    health = http.get("/health").json()
    assert health["status"] == "ok"
    # the engine answers on, from a healthy model
    reply = client.chat.completions.create(model=HEALTHY, messages=ASK, max_tokens=4,
                                           temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")


def _counted(http) -> float:
    total = 0.0
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("homerack_model_errors_total"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_anthropic_and_ollama_clients_get_the_model_error_in_their_shapes(served):
    import anthropic
    import ollama

    address, _ = served
    with pytest.raises(anthropic.InternalServerError) as raised:
        anthropic.Anthropic(base_url=address.url, api_key=address.token, max_retries=0) \
            .messages.create(model=ALL_NAN, max_tokens=8, messages=ASK)
    assert "NaN" in str(raised.value) and f"{ALL_NAN}.gguf" in str(raised.value)
    client = ollama.Client(host=address.url, headers={"Authorization": f"Bearer {address.token}"})
    with pytest.raises(ollama.ResponseError) as failed:
        client.chat(model=ALL_NAN, messages=ASK, options={"num_predict": 8})
    assert failed.value.status_code == 500 and "NaN" in failed.value.error
    with pytest.raises(ollama.ResponseError) as failed:  # streamed: the error ends the stream
        for _ in client.chat(model=ALL_NAN, messages=ASK, stream=True):
            pass
    assert "NaN" in failed.value.error
