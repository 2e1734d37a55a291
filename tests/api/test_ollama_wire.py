"""Ollama's wire shapes from a turn's events (engine/api/wire_formats/ollama_routes.py), without a
model: reasoning as `thinking`, text as content, a tool call whole with its arguments
as an object (Ollama's clients do not assemble pieces), durations in nanoseconds; and
`keep_alive` read as Ollama reads it."""

import asyncio
import json

import pytest

from engine.api.wire_formats.ollama_routes import _chunks, _conversation
from engine.api.wire_formats.ollama_schemas import OllamaChat, keep_of
from engine.api.turns import Done
from engine.errors import InvalidRequest
from engine.events import Usage
from engine.formats.parsed import CallArgs, CallStart, Reasoning, Text
from engine.presets import Keep

USAGE = Usage(prompt_tokens=12, completion_tokens=6, cached_tokens=0, queue_s=0.0,
              time_to_first_token_s=0.25, prompt_tokens_per_s=48.0, decode_tokens_per_s=12.0)


class FakeTurn:
    citations = None  # not grounded

    def __init__(self, events):
        self._events, self.cancelled = events, False

    async def events(self):
        for event in self._events:
            yield event

    def cancel(self):
        self.cancelled = True


def lines(events, field="message") -> list[dict]:
    async def collect():
        return [json.loads(line) async for line in _chunks(FakeTurn(events), "m:1b", field, 0.0)]
    return asyncio.run(collect())


def test_a_streamed_chat_answer_in_ollamas_shape():
    got = lines([Reasoning("Paris is "), Reasoning("the one."), Text("Paris."),
                 CallStart(0, "call_1", "get_weather"), CallArgs(0, '{"city": '),
                 CallArgs(0, '"Paris"}'), Done("tool_calls", USAGE)])
    assert [g["message"].get("thinking") for g in got[:2]] == ["Paris is ", "the one."]
    assert got[2]["message"] == {"role": "assistant", "content": "Paris."}
    assert got[3]["message"]["tool_calls"] == [
        {"function": {"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}}]
    last = got[-1]
    assert last["done"] and last["done_reason"] == "stop" and last["model"] == "m:1b"
    assert last["eval_count"] == 6 and last["prompt_eval_count"] == 12
    assert last["prompt_eval_duration"] == 250_000_000 and last["eval_duration"] == 500_000_000
    assert all(not g["done"] for g in got[:-1]) and got[0]["created_at"].endswith("Z")


def test_a_generate_answer_and_a_cut_one():
    got = lines([Text("The capital"), Done("length", USAGE)], field="response")
    assert got[0]["response"] == "The capital" and got[-1]["done_reason"] == "length"


def test_tool_results_answer_calls_by_name_and_order():
    chat = OllamaChat.model_validate({"model": "m", "messages": [
        {"role": "user", "content": "weather and time?"},
        {"role": "assistant", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Oslo"}}},
            {"function": {"name": "get_time", "arguments": {"city": "Oslo"}}}]},
        {"role": "tool", "tool_name": "get_time", "content": "12:00"},
        {"role": "tool", "content": "snow"}]})
    messages = _conversation(chat).messages
    assert [c.id for c in messages[1].calls] == ["call_1", "call_2"]
    assert (messages[2].call_id, messages[3].call_id) == ("call_2", "call_1")
    orphan = OllamaChat.model_validate({"model": "m", "messages": [
        {"role": "tool", "content": "x"}]})
    with pytest.raises(InvalidRequest, match="answers no earlier tool call"):
        _conversation(orphan)


@pytest.mark.parametrize("given, keep", [
    (None, None), (0, Keep(ttl_s=0.0)), ("5m", Keep(ttl_s=300.0)), ("1h30m", Keep(ttl_s=5400.0)),
    ("300", Keep(ttl_s=300.0)), (-1, Keep(pinned=True)), ("-1m", Keep(pinned=True)),
    ("250ms", Keep(ttl_s=0.25))])
def test_keep_alive_is_read_as_ollama_reads_it(given, keep):
    assert keep_of(given) == keep


def test_a_keep_alive_that_is_not_a_duration_names_the_field():
    with pytest.raises(InvalidRequest) as refused:
        keep_of("soon")
    assert refused.value.param == "keep_alive"


def test_a_models_own_system_prompt_and_stops_apply_when_a_request_has_none(tmp_path):
    from engine.catalog.models import LocalModel
    from engine.engine import with_system
    from engine.events import GenerationRequest

    model = LocalModel("m:1b", tmp_path / "blob", 1, False, source="ollama",
                       params=(("stop", ("<|im_end|>",)),), system="Be terse.")
    asked = GenerationRequest(model=model, messages=({"role": "user", "content": "hi"},))
    assert with_system(asked).messages[0] == {"role": "system", "content": "Be terse."}
    own = GenerationRequest(model=model, messages=({"role": "system", "content": "Mine."},
                                                   {"role": "user", "content": "hi"}))
    assert with_system(own).messages == own.messages
    assert model.stops() == ("<|im_end|>",)


def test_a_loaded_model_whose_file_is_no_longer_listed_still_shows_in_ps():
    from engine.api.wire_formats.ollama_routes import _running

    entry = {"id": "gone:7b", "memory": {"CPU": 1000, "CUDA0": 3000}, "ttl_s": None,
             "pinned": False, "idle_s": 3.0, "n_ctx": 4096}
    shown = _running(None, entry, None)  # its source turned off while it is loaded
    assert shown["name"] == "gone:7b" and shown["size"] == 4000 and shown["size_vram"] == 3000
    assert shown["context_length"] == 4096 and shown["expires_at"].startswith("0001")
