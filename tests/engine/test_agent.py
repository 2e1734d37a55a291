"""The agent layer without a model: JSON-schema checks and grammars, the tool-call forms
of chat templates, and reading calls out of streamed text."""

import json

import pytest

from support.agent_templates import HERMES, LLAMA3, MISTRAL
from engine.conversation.compose import compose
from engine.conversation.conversation import Choice, Conversation, Message, ToolCall, checked, tool
from engine.conversation.json_schema import Branch, check
from engine.catalog.chat_format import ChatFormat
from engine.formats.families import detect
from engine.errors import InvalidRequest
from engine.llama.grammar import composed_grammar, grammar

WEATHER = tool("get_weather", "Weather in a city",
               {"type": "object", "properties": {"city": {"type": "string"}},
                "required": ["city"]}, "tools[0]")
ADD = tool("add", "Add", {"type": "object", "properties": {"a": {"type": "integer"},
                                                           "b": {"type": "integer"}},
                          "required": ["a", "b"]}, "tools[1]")


@pytest.mark.parametrize("schema, param", [
    ({"type": "integer", "minimum": 3}, "s.minimum"),
    ({"type": "object", "properties": {"x": {"oneOf": [{"type": "string"}]}}},
     "s.properties.x.oneOf"),
    ({"type": "string", "format": "email"}, "s.format"),
    ({"$ref": "https://example.org/schema.json"}, "s.$ref"),
    ({"type": "object", "properties": {"a": {"type": "string"}}, "required": ["b"]},
     "s.required"),
    ({"type": "nope"}, "s"),
    ("not a schema", "s"),
])
def test_schema_features_the_grammar_cannot_enforce_are_refused_by_name(schema, param):
    with pytest.raises(InvalidRequest) as raised:
        check(schema, "s")
    assert raised.value.param == param


def test_supported_schema_becomes_a_grammar_with_strict_strings():
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 20}, "tags": {"type": "array", "items": {
            "enum": ["a", "b"]}, "minItems": 1}, "when": {"type": "string", "format": "date"},
        "kind": {"anyOf": [{"const": 1}, {"type": "null"}]}}, "required": ["name"]}
    check(schema, "s")
    gbnf = grammar([Branch(schema, "<x>", "</x>")], "s")
    assert 'root ::= ("<x>" b0 "</x>")' in gbnf
    assert r"\x00-\x1F" in gbnf  # raw control characters are not JSON


def test_an_agents_tool_schemas_become_grammars_as_far_as_they_can():
    """Claude Code's tools: a string of at most 524,288 characters (no grammar holds that
    bound: it is left out and reported) and a property with a description alone (any
    JSON value, as JSON Schema means it)."""
    script = tool("Workflow", "Run a script", {"type": "object", "properties": {
        "script": {"type": "string", "maxLength": 524_288},
        "args": {"description": "the script's input, verbatim"}}}, "tools[22]")
    assert script.unenforced == ("tools[22].properties.script.maxLength",)
    assert "maxLength" not in json.dumps(script.parameters)
    gbnf = grammar([Branch(script.parameters)], "tools")
    assert "value" in gbnf and "{0,524288}" not in gbnf
    with pytest.raises(InvalidRequest) as raised:  # the answer's own schema: refused
        check({"type": "string", "maxLength": 524_288}, "s")
    assert raised.value.param == "s.maxLength"


def test_templates_are_recognised_by_their_tool_call_form():
    assert detect(HERMES).name == "hermes"
    assert detect(LLAMA3).name == "llama3"
    assert detect(MISTRAL).name == "mistral-nemo"
    assert detect("{{ messages }}").name == "generic" and detect(None).name == "generic"


def _compose(conv, template):
    return compose(conv, detect(template))


def _history() -> Conversation:
    call = ToolCall("call_1", "get_weather", {"city": "Paris"})
    return Conversation((Message("user", "Weather in Paris?"),
                         Message("assistant", "", (call,)),
                         Message("tool", "Sunny, 24 C", call_id="call_1"),
                         Message("user", "And add 2 and 3")), (WEATHER, ADD))


@pytest.mark.parametrize("template, expected", [
    (HERMES, ['"name": "get_weather"', "<tool_call>", "<tool_response>\nSunny, 24 C"]),
    (LLAMA3, ["Environment: ipython", '"parameters": {"city": "Paris"}', "ipython<|end_header_id|>"]),
    (MISTRAL, ["[AVAILABLE_TOOLS]", '[TOOL_CALLS][{"name": "get_weather", "arguments": '
              '{"city": "Paris"}}]', "[TOOL_RESULTS]"]),
])
def test_native_templates_receive_tools_calls_and_results(template, expected):
    composed = _compose(_history(), template)
    prompt = ChatFormat("t", template, "<s>", "</s>", False, ()).render(
        list(composed.messages), list(composed.tools))
    for text in expected:
        assert text in prompt
    assert '"add"' in prompt and composed_grammar(composed) is None  # auto: the model writes freely


def test_a_template_without_tools_gets_them_described_and_json_answers():
    composed = _compose(_history(), None)
    system = composed.messages[0]
    assert system["role"] == "system" and '"get_weather"' in system["content"]
    assert json.loads(composed.messages[2]["content"]) == {
        "tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    assert json.loads(composed.messages[3]["content"])["tool_response"]["tool"] == "get_weather"
    assert composed.tools is None and "response-kv" in composed_grammar(composed)  # auto: call or answer


def test_choices_shape_the_grammar():
    def conv(choice):
        return Conversation((Message("user", "hi"),), (WEATHER, ADD), choice)

    named = composed_grammar(_compose(conv(Choice("function", "add")), HERMES))
    assert '"\\"add\\""' in named and "get_weather" not in named
    assert ")+" in composed_grammar(_compose(conv(Choice("required")), HERMES))  # several calls
    assert ")+" not in composed_grammar(_compose(conv(Choice("required", parallel=False)), HERMES))
    assert _compose(conv(Choice("none")), HERMES).tools is None
    assert composed_grammar(_compose(conv(Choice("none")), None)) is None


def test_tool_schema_keywords_no_grammar_enforces_are_reported_not_refused():
    fetch = tool("fetch", "Fetch a page", {"type": "object", "properties": {
        "url": {"type": "string", "format": "uri"}, "retries": {"type": "integer", "minimum": 0}},
        "required": ["url"]}, "tools[0].input_schema")
    assert fetch.unenforced == ("tools[0].input_schema.properties.url.format",
                                "tools[0].input_schema.properties.retries.minimum")
    conv = Conversation((Message("user", "hi"),), (fetch,), Choice("required"))
    assert "retries.minimum" in conv.notes()[0]
    assert composed_grammar(_compose(conv, None))  # the rest of the schema still holds the call
    with pytest.raises(InvalidRequest) as raised:
        tool("f", "", {"type": "object", "properties": {"x": {"type": 3}}}, "tools[1].parameters")
    assert raised.value.param == "tools[1].parameters"


def test_impossible_requests_are_refused_naming_the_field():
    with pytest.raises(InvalidRequest) as raised:
        checked(Conversation((Message("user", "hi"),), (WEATHER,), Choice("function", "nope")),
                "tool_choice")
    assert raised.value.param == "tool_choice"
    with pytest.raises(InvalidRequest) as raised:
        checked(Conversation((Message("user", "hi"),
                              Message("tool", "x", call_id="call_9", where="messages[1]"))),
                "tool_choice")
    assert raised.value.param == "messages[1]"
    with pytest.raises(InvalidRequest):
        checked(Conversation((Message("user", "hi"),), (), Choice("required")), "tool_choice")


def test_a_forced_call_is_written_in_the_familys_own_syntax_after_optional_reasoning():
    from engine.formats.families import FAMILIES

    conv = Conversation((Message("user", "hi"),), (WEATHER,), Choice("required"))
    harmony = compose(conv, FAMILIES["harmony"])
    assert harmony.tools and "to=functions.get_weather" in composed_grammar(harmony)
    assert "reasoning ::=" in composed_grammar(harmony) and "root ::= reasoning?" in composed_grammar(harmony)
    assert composed_grammar(compose(Conversation(conv.messages, (WEATHER,)), FAMILIES["harmony"])) is None
    mistral = composed_grammar(compose(conv, FAMILIES["mistral-small-3.2"]))
    assert "[TOOL_CALLS]get_weather[ARGS]" in mistral and "reasoning" not in mistral
    qwen = composed_grammar(compose(conv, FAMILIES["qwen3"]))
    assert '"<think>"?' in qwen and "<tool_call>" in qwen
    coder = compose(conv, FAMILIES["qwen3-coder"])
    assert composed_grammar(coder) is None and "not enforced" in coder.notes[0]
