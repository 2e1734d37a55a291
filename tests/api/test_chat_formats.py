"""Every real chat template of llama.cpp's test set renders through the API, a plain
conversation and one with tools and tool history; each in a tiny random model of its own
(the template is what is tested: a real GGUF file, real llama.cpp, the real engine)."""

import pytest

from tiny_gguf import write_tiny_model  # packaging/
from support.engines import api_client, start_engine
from support.llama_templates import llama_cpp_templates

TOOLS = [{"type": "function", "function": {
    "name": "get_time", "description": "The time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
PLAIN = [{"role": "system", "content": "You are terse."},
         {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello."},
         {"role": "user", "content": "What time is it in Paris?"}]
WITH_TOOLS = [{"role": "user", "content": "What time is it in Paris?"},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"id": "call_abc123", "type": "function",
                   "function": {"name": "get_time", "arguments": '{"city": "Paris"}'}}]},
              {"role": "tool", "tool_call_id": "call_abc123", "content": "10:42"},
              {"role": "user", "content": "And in Rome?"}]


@pytest.fixture(scope="module")
def templated(home):
    """An engine whose models folder holds each template in a tiny model (8k context:
    Devstral's system prompt alone is ~6k of the tiny vocabulary's tokens)."""
    models = home / "formats" / "data" / "models"
    models.mkdir(parents=True, exist_ok=True)
    names = {}
    for name, template in llama_cpp_templates().items():
        model_id = f"t-{name.lower()}"[:60]
        write_tiny_model(models / f"{model_id}.gguf", chat_template=template, n_ctx=8192)
        names[name] = model_id
    process, address, _ = start_engine(home, "formats", ["--ctx", "8192"])
    with api_client(address) as session:
        yield names, session
    process.stop()


def test_llama_cpp_test_set_is_at_hand():
    assert len(llama_cpp_templates()) >= 28


def test_every_template_renders_plain_and_tool_conversations(templated):
    names, http = templated
    failures = {}
    for name, model_id in names.items():
        for kind, body in (("plain", {"messages": PLAIN}),
                           ("tools", {"messages": WITH_TOOLS, "tools": TOOLS})):
            reply = http.post("/v1/chat/completions",
                              json={"model": model_id, "max_tokens": 1, **body})
            if reply.status_code != 200:
                failures[f"{name} ({kind})"] = f"{reply.status_code} {reply.text[:300]}"
    assert not failures, "\n".join(f"{k}: {v}" for k, v in failures.items())
