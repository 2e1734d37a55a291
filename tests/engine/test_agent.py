"""The agent layer without a model: JSON-schema checks and grammars, the tool-call forms
of chat templates, and reading calls out of streamed text."""

import json

import pytest

from support.agent_templates import HERMES, LLAMA3, MISTRAL
from engine.agent.compose import compose
from engine.agent.conversation import Choice, Conversation, Message, ToolCall, checked, tool
from engine.agent.json_schema import Branch, check, grammar
from engine.agent.tool_formats import GENERIC, HERMES as HERMES_FORMAT, LLAMA3 as LLAMA3_FORMAT
from engine.agent.tool_formats import MISTRAL as MISTRAL_FORMAT, detect
from engine.agent.tool_stream import CallArgs, CallStart, Text
from engine.catalog.chat_format import ChatFormat
from engine.errors import InvalidRequest

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


def test_templates_are_recognised_by_their_tool_call_form():
    assert detect(HERMES) is HERMES_FORMAT
    assert detect(LLAMA3) is LLAMA3_FORMAT
    assert detect(MISTRAL) is MISTRAL_FORMAT
    assert detect("{{ messages }}") is GENERIC and detect(None) is GENERIC


def _history() -> Conversation:
    call = ToolCall("call_1", "get_weather", {"city": "Paris"})
    return Conversation((Message("user", "Weather in Paris?"),
                         Message("assistant", "", (call,)),
                         Message("tool", "Sunny, 24 C", call_id="call_1"),
                         Message("user", "And add 2 and 3")), (WEATHER, ADD))


@pytest.mark.parametrize("template, expected", [
    (HERMES, ['"name": "get_weather"', "<tool_call>", "<tool_response>\nSunny, 24 C"]),
    (LLAMA3, ["Environment: ipython", '"parameters": {"city": "Paris"}', "ipython<|end_header_id|>"]),
    (MISTRAL, ["[AVAILABLE_TOOLS]", '[TOOL_CALLS][{"arguments": {"city": "Paris"}, "name": '
              '"get_weather"}]', "[TOOL_RESULTS]"]),
])
def test_native_templates_receive_tools_calls_and_results(template, expected):
    composed = compose(_history(), template)
    prompt = ChatFormat("t", template, "<s>", "</s>", False, ()).render(
        list(composed.messages), list(composed.tools))
    for text in expected:
        assert text in prompt
    assert '"add"' in prompt and composed.grammar is None  # auto: the model writes freely


def test_a_template_without_tools_gets_them_described_and_json_answers():
    composed = compose(_history(), None)
    system = composed.messages[0]
    assert system["role"] == "system" and '"get_weather"' in system["content"]
    assert json.loads(composed.messages[2]["content"]) == {
        "tool_call": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    assert json.loads(composed.messages[3]["content"])["tool_response"]["tool"] == "get_weather"
    assert composed.tools is None and "response-kv" in composed.grammar  # auto: call or answer


def test_choices_shape_the_grammar():
    def conv(choice):
        return Conversation((Message("user", "hi"),), (WEATHER, ADD), choice)

    named = compose(conv(Choice("function", "add")), HERMES).grammar
    assert '"\\"add\\""' in named and "get_weather" not in named
    assert ")+" in compose(conv(Choice("required")), HERMES).grammar  # several calls
    assert ")+" not in compose(conv(Choice("required", parallel=False)), HERMES).grammar
    assert compose(conv(Choice("none")), HERMES).tools is None
    assert compose(conv(Choice("none")), None).grammar is None


def test_tool_schema_keywords_no_grammar_enforces_are_reported_not_refused():
    fetch = tool("fetch", "Fetch a page", {"type": "object", "properties": {
        "url": {"type": "string", "format": "uri"}, "retries": {"type": "integer", "minimum": 0}},
        "required": ["url"]}, "tools[0].input_schema")
    assert fetch.unenforced == ("tools[0].input_schema.properties.url.format",
                                "tools[0].input_schema.properties.retries.minimum")
    conv = Conversation((Message("user", "hi"),), (fetch,), Choice("required"))
    assert "retries.minimum" in conv.notes()[0]
    assert compose(conv, None).grammar  # the rest of the schema still holds the call
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


def _read(fmt, text: str, step: int):
    stream = fmt.stream(Conversation((Message("user", "x"),), (WEATHER,)))
    events = []
    for i in range(0, len(text), step):
        events += stream.feed(text[i:i + step])
    return events + stream.finish()


def _summary(events):
    text = "".join(e.text for e in events if isinstance(e, Text))
    names = [e.name for e in events if isinstance(e, CallStart)]
    args = {}
    for e in events:
        if isinstance(e, CallArgs):
            args[e.index] = args.get(e.index, "") + e.text
    return text, names, [json.loads(args[i]) for i in sorted(args)]


@pytest.mark.parametrize("fmt, output, expected", [
    (HERMES_FORMAT, 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": '
     '{"city": "Paris \\"Nord\\""}}\n</tool_call>\n<tool_call>\n{"name": "add", "arguments": '
     '{"a": 1, "b": 2}}\n</tool_call>',
     ("Let me check.\n", ["get_weather", "add"], [{"city": 'Paris "Nord"'}, {"a": 1, "b": 2}])),
    (LLAMA3_FORMAT, '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
     ("", ["get_weather"], [{"city": "Oslo"}])),
    (MISTRAL_FORMAT, '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}}, '
     '{"name": "get_weather", "arguments": {"city": "Rome"}}]',
     ("", ["add", "get_weather"], [{"a": 2, "b": 3}, {"city": "Rome"}])),
    (MISTRAL_FORMAT, '[{"name": "add", "arguments": {"a": 2, "b": 3}}]',  # token not rendered
     ("", ["add"], [{"a": 2, "b": 3}])),
    (GENERIC, '{"tool_call": {"name": "get_weather", "arguments": {"city": "Lima"}}}',
     ("", ["get_weather"], [{"city": "Lima"}])),
    (GENERIC, '{"response": "Caf\\u00e9 \\"au lait\\"\\nis {good}"}',
     ('Café "au lait"\nis {good}', [], [])),
    (HERMES_FORMAT, '<tool_call>{"arguments": {"city": "Bern"}, "name": "get_weather"}'
     '</tool_call>', ("", ["get_weather"], [{"city": "Bern"}])),  # keys in another order
    (LLAMA3_FORMAT, '{"answer": 42} is a JSON object.', ('{"answer": 42} is a JSON object.', [], [])),
    (HERMES_FORMAT, "No tools needed: 2 < 3 and <b>bold</b>.",
     ("No tools needed: 2 < 3 and <b>bold</b>.", [], [])),
])
@pytest.mark.parametrize("step", [1, 3, 1000])
def test_calls_and_text_are_read_from_output_streamed_in_any_pieces(fmt, output, expected, step):
    assert _summary(_read(fmt, output, step)) == expected


def test_arguments_stream_in_pieces_as_they_are_written():
    events = _read(HERMES_FORMAT, '<tool_call>{"name": "get_weather", "arguments": '
                                  '{"city": "Paris"}}</tool_call>', 4)
    pieces = [e.text for e in events if isinstance(e, CallArgs)]
    assert len(pieces) > 3 and "".join(pieces) == '{"city": "Paris"}'
    assert isinstance(events[0], CallStart) and events[0].id.startswith("call_")
