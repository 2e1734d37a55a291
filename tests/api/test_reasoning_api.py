"""Reasoning models through the API, in their own formats: the starter's weights with
gpt-oss's, Qwen3's and DeepSeek-R1's real templates (llama.cpp's test set), its output
forced with llama-server's `grammar` field so that it speaks each format exactly. The
gpt-oss copy holds harmony's markers as control tokens of its vocabulary (the starter's
unused ones renamed), which the grammar names token by token."""

import json

import anthropic
import openai
import pytest

from support.llama_templates import llama_cpp_templates
from support.models import STARTER, with_template

HARMONY_TOKENS = {3: "<|start|>", 4: "<|channel|>", 5: "<|message|>", 6: "<|end|>",
                  7: "<|return|>", 8: "<|call|>", 9: "<|constrain|>"}
ASK = [{"role": "user", "content": "What is the capital of France?"}]
TIME = [{"type": "function", "function": {
    "name": "get_time", "description": "The time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]

HARMONY_ANSWER = ('root ::= <|channel|> "analysis" <|message|> "The user asks. Paris." <|end|> '
                  '<|start|> "assistant" <|channel|> "final" <|message|> "Paris."')
HARMONY_CALL = ('root ::= <|channel|> "analysis" <|message|> "Need the time." <|end|> '
                '<|start|> "assistant" <|channel|> "commentary to=functions.get_time " '
                '<|constrain|> "json" <|message|> "{\\"city\\": \\"Paris\\"}"')


@pytest.fixture(scope="module")
def models(server, starters_dir, tmp_path_factory):
    """The three reasoning-format copies, in the shared engine's models folder."""
    folder, templates = tmp_path_factory.mktemp("reasoning"), llama_cpp_templates()
    source = starters_dir / f"{STARTER}.gguf"
    made = {
        "gpt-oss": with_template(source, folder / "smol-gpt-oss.gguf",
                                 templates["openai-gpt-oss-120b"], HARMONY_TOKENS),
        "qwen3": with_template(source, folder / "smol-qwen3.gguf",
                               templates["Qwen-Qwen3-0.6B"]),
        "r1": with_template(source, folder / "smol-r1.gguf",
                            templates["deepseek-ai-DeepSeek-R1-Distill-Qwen-32B"]),
    }
    for path in made.values():
        (server[2] / path.name).symlink_to(path)
    yield {kind: path.stem for kind, path in made.items()}
    for path in made.values():
        (server[2] / path.name).unlink()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0].url}/v1", api_key=server[0].token,
                         max_retries=0, timeout=120)


def _ask(client, model, grammar, **extra):
    return client.chat.completions.create(model=model, messages=ASK, max_tokens=60,
                                          temperature=0, extra_body={"grammar": grammar},
                                          **extra)


def test_gpt_oss_answers_its_final_channel_with_its_analysis_apart(client, models):
    reply = _ask(client, models["gpt-oss"], HARMONY_ANSWER)
    message = reply.choices[0].message
    assert message.content == "Paris."
    assert message.model_extra["reasoning_content"] == "The user asks. Paris."
    assert reply.choices[0].finish_reason == "stop"


def test_gpt_oss_streams_reasoning_then_answer_without_a_marker(client, models):
    chunks = list(client.chat.completions.create(
        model=models["gpt-oss"], messages=ASK, max_tokens=60, temperature=0, stream=True,
        extra_body={"grammar": HARMONY_ANSWER}))
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    reasoning = "".join(d.model_extra.get("reasoning_content") or "" for d in deltas)
    content = "".join(d.content or "" for d in deltas)
    assert (reasoning, content) == ("The user asks. Paris.", "Paris.")
    assert all("<|" not in (d.content or "") + (d.model_extra.get("reasoning_content") or "")
               for d in deltas)


def test_gpt_oss_native_tool_call_comes_back_as_tool_calls(client, models):
    reply = client.chat.completions.create(
        model=models["gpt-oss"], messages=ASK, tools=TIME, max_tokens=60, temperature=0,
        extra_body={"grammar": HARMONY_CALL})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_time"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert choice.message.model_extra["reasoning_content"] == "Need the time."


def test_gpt_oss_renders_its_effort_and_keeps_reasoning_inline_when_asked(client, models):
    reply = _ask(client, models["gpt-oss"], HARMONY_ANSWER, reasoning_effort="high",
                 extra_query=None)
    assert reply.choices[0].message.content == "Paris."
    inline = client.chat.completions.create(
        model=models["gpt-oss"], messages=ASK, max_tokens=60, temperature=0,
        extra_body={"grammar": HARMONY_ANSWER, "reasoning_format": "none"})
    assert "The user asks. Paris." in inline.choices[0].message.content
    assert "reasoning_content" not in inline.choices[0].message.model_extra


@pytest.mark.parametrize("kind, grammar", [
    ("qwen3", 'root ::= "<think>\\nStep one.\\n</think>\\n\\nParis."'),
    ("r1", 'root ::= "Step one.\\n</think>\\n\\nParis."'),  # its prompt opens <think>
])
def test_think_tags_are_separated(client, models, kind, grammar):
    message = _ask(client, models[kind], grammar).choices[0].message
    assert message.content == "Paris."
    assert message.model_extra["reasoning_content"] == "Step one."


def test_anthropic_thinking_blocks(server, models):
    claude = anthropic.Anthropic(base_url=server[0].url, api_key=server[0].token,
                                 max_retries=0)
    reply = claude.messages.create(
        model=models["qwen3"], max_tokens=60, messages=ASK,
        thinking={"type": "enabled", "budget_tokens": 1024},
        extra_body={"grammar": 'root ::= "<think>\\nStep one.\\n</think>\\n\\nParis."'})
    assert [b.type for b in reply.content] == ["thinking", "text"]
    assert reply.content[0].thinking == "Step one." and reply.content[1].text == "Paris."


def test_responses_reasoning_item(client, models):
    reply = client.responses.create(
        model=models["qwen3"], input="What is the capital of France?", max_output_tokens=60,
        reasoning={"effort": "medium"},
        extra_body={"grammar": 'root ::= "<think>\\nStep one.\\n</think>\\n\\nParis."'})
    kinds = [item.type for item in reply.output]
    assert kinds == ["reasoning", "message"]
    assert reply.output[0].content[0].text == "Step one." and reply.output_text == "Paris."


def test_a_grammar_naming_an_end_of_generation_token_ends_the_answer(client, models):
    """llama.cpp aborts the process when a grammar is handed an end-of-generation token
    it is not complete at: the engine stops the answer instead (and lives)."""
    reply = _ask(client, models["gpt-oss"], 'root ::= "Par" <|call|> "is"')
    assert reply.choices[0].message.content in ("Par", None)
    assert _ask(client, models["gpt-oss"], HARMONY_ANSWER).choices[0].message.content == "Paris."


@pytest.mark.parametrize("field, value", [
    ("reasoning_effort", "extreme"), ("chat_template_kwargs", "yes"),
    ("grammar", 'root ::= "unclosed'), ("reasoning_format", "sideways"),
])
def test_bad_reasoning_fields_are_refused_naming_them(http, models, field, value):
    reply = http.post("/v1/chat/completions", json={
        "model": models["qwen3"], "messages": ASK, "max_tokens": 4, field: value})
    assert reply.status_code == 400, reply.text
    assert field in json.dumps(reply.json()["error"])


def test_a_thinking_budget_ends_the_reasoning_with_the_closing_marker(client, http, models):
    """DeepSeek-R1's prompt opens <think>: after 6 tokens of it the engine writes
    </think> for the model, which then answers."""
    reply = client.chat.completions.create(
        model=models["r1"], messages=ASK, max_tokens=40, temperature=0,
        extra_body={"thinking_budget_tokens": 6})
    message = reply.choices[0].message
    thought = message.model_extra["reasoning_content"]
    tokens = http.post("/tokenize", json={"content": thought, "model": models["r1"]}).json()
    assert 0 < len(tokens["tokens"]) <= 6
    assert message.content and "</think>" not in message.content
    assert reply.usage.completion_tokens > 6
    free = client.chat.completions.create(model=models["r1"], messages=ASK, max_tokens=40,
                                          temperature=0)
    assert len(free.choices[0].message.model_extra.get("reasoning_content") or "") > len(thought)


def test_gpt_oss_forced_call_is_written_in_harmony_without_a_grammar_of_the_clients(
        client, models):
    """tool_choice "required": the engine's own grammar writes the call in harmony, and
    it comes back as tool_calls. (reasoning_format "none" leaves out the optional
    reasoning before the call, which the starter would fill to max_tokens: it never
    writes harmony's <|end|>.)"""
    reply = client.chat.completions.create(
        model=models["gpt-oss"], messages=ASK, tools=TIME, tool_choice="required",
        max_tokens=80, temperature=0, extra_body={"reasoning_format": "none"})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    call = choice.message.tool_calls[0]
    assert call.function.name == "get_time"
    assert isinstance(json.loads(call.function.arguments)["city"], str)
