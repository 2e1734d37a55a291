"""Reading answers in each family's own format, after the parse expectations of
llama.cpp's tests/test-chat.cpp (input text -> content, reasoning, tool calls), whole and
streamed a few characters at a time."""

import json

import pytest

from engine.formats.families import FAMILIES, detect
from engine.formats.parsed import CallArgs, CallStart, Reasoning, Text
from engine.formats.stream import FormatStream, Reading

TOOLS = {"special_function": {"type": "object", "properties": {"arg1": {"type": "integer"}}},
         "get_time": {"type": "object", "properties": {"city": {"type": "string"}}},
         "empty_args": {"type": "object", "properties": {}}}
HELLO = "Hello, world!\nWhat's up?"
CALL = [("special_function", {"arg1": 1})]

# family, answer, opened (the prompt left it thinking), content, reasoning, calls
VECTORS = [
    ("qwen3", HELLO, False, HELLO, "", []),
    ("qwen3", "<think>I'm\nthinking</think>" + HELLO, False, HELLO, "I'm\nthinking", []),
    ("qwen3", '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "special_function", '
     '"arguments": {"arg1": 1}}\n</tool_call>', False, "", "hm", CALL),
    ("hermes", HELLO + '<tool_call>\n{"name": "special_function", "arguments": {"arg1": 1}}'
     "</tool_call>", False, HELLO, "", CALL),
    ("hermes", '<tool_call>{"arguments": {"arg1": 1}, "name": "special_function"}</tool_call>',
     False, "", "", CALL),
    ("hermes", "2 < 3 and <b>bold</b>.", False, "2 < 3 and <b>bold</b>.", "", []),
    ("qwen3-coder", "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n"
     "</parameter>\n</function>\n</tool_call>", False, "", "", CALL),
    ("qwen3-coder", "Let me call it.\n<tool_call>\n<function=get_time>\n<parameter=city>\n"
     "Paris\n</parameter>\n</function>\n</tool_call>", False, "Let me call it.", "",
     [("get_time", {"city": "Paris"})]),
    ("llama3", '{"name": "special_function", "parameters": {"arg1": 1}}', False, "", "", CALL),
    ("llama3", '<|python_tag|>{"name": "special_function", "parameters": {"arg1": 1}}', False,
     "", "", CALL),
    ("llama3", '{"answer": 42} is JSON.', False, '{"answer": 42} is JSON.', "", []),
    ("llama3", '<|python_tag|>get_time.call(city="Paris")', False, "", "",
     [("get_time", {"city": "Paris"})]),
    ("mistral-nemo", '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, '
     '"id": "123456789"}]', False, "", "", CALL),
    ("mistral-small-3.2", '[TOOL_CALLS]special_function[CALL_ID]123456789[ARGS]{"arg1": 1}',
     False, "", "", CALL),
    ("mistral-small-3.2", '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}[TOOL_CALLS]get_time'
     '[ARGS]{"city": "Rome"}', False, "", "", CALL + [("get_time", {"city": "Rome"})]),
    ("magistral", "[THINK]I'm\nthinking[/THINK]" + HELLO, False, HELLO, "I'm\nthinking", []),
    ("magistral", '[THINK]I\'m\nthinking[/THINK][TOOL_CALLS]special_function[ARGS]{"arg1":1}',
     False, "", "I'm\nthinking", CALL),
    ("harmony", "<|channel|>final<|message|>" + HELLO, False, HELLO, "", []),
    ("harmony", "<|channel|>commentary<|message|>" + HELLO, False, HELLO, "", []),
    ("harmony", "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant"
     "<|channel|>final<|message|>" + HELLO, False, HELLO, "I'm\nthinking", []),
    ("harmony", ' to=functions.special_function<|channel|>analysis<|message|>{"arg1": 1}',
     False, "", "", CALL),
    ("harmony", '<|channel|>analysis to=functions.special_function<|message|>{"arg1": 1}',
     False, "", "", CALL),
    ("harmony", " to=functions.special_function<|channel|>analysis <|constrain|>json"
     '<|message|>{"arg1": 1}', False, "", "", CALL),
    ("harmony", "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant to="
     'functions.special_function<|channel|>analysis<|message|>{"arg1": 1}', False, "",
     "I'm\nthinking", CALL),
    ("deepseek-r1", "I'm\nthinking</think>" + HELLO, True, HELLO, "I'm\nthinking", []),
    ("deepseek-r1", "</think>" + HELLO, True, HELLO, "", []),
    ("deepseek-r1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
     'special_function\n```json\n{"arg1": 1}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', False,
     "", "", CALL),
    ("deepseek-v3.1", '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>'
     '{"city": "XYZCITY"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>', False, "", "",
     [("get_time", {"city": "XYZCITY"})]),
    ("deepseek-v3.1", " thinking</think>" + HELLO, True, HELLO, "thinking", []),
    ("deepseek-v3.2", 'Let me check the time</think>\n\n<｜DSML｜function_calls>\n'
     '<｜DSML｜invoke name="get_time">\n<｜DSML｜parameter name="city" string="true">Tokyo'
     '</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>', True, "",
     "Let me check the time", [("get_time", {"city": "Tokyo"})]),
    ("glm-4.5", "<tool_call>special_function\n<arg_key>arg1</arg_key>\n<arg_value>1"
     "</arg_value>\n</tool_call>", False, "", "", CALL),
    ("kimi-k2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.special_function:0"
     '<|tool_call_argument_begin|>{"arg1": 1}<|tool_call_end|><|tool_calls_section_end|>',
     False, "", "", CALL),
    ("minimax-m2", "I'm\nthinking\n</think>\n\n" + HELLO, True, HELLO, "I'm\nthinking", []),
    ("minimax-m2", '\n</think>\n\n<minimax:tool_call>\n<invoke name="special_function">\n'
     '<parameter name="arg1">1</parameter>\n</invoke>\n</minimax:tool_call>', True, "", "",
     CALL),
    ("minimax-m2", 'Let\'s call a tool:\n</think>\n\n<minimax:tool_call>\n<invoke name='
     '"empty_args">\n</invoke>\n</minimax:tool_call>', True, "", "Let's call a tool:",
     [("empty_args", {})]),
    ("command-r7b", "<|START_RESPONSE|>" + HELLO + "<|END_RESPONSE|>", False, HELLO, "", []),
    ("command-r7b", "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_ACTION|>[\n"
     '    {"tool_call_id": "0", "tool_name": "special_function", "parameters": {"arg1": 1}}\n'
     "]<|END_ACTION|>", False, "", "I'm\nthinking", CALL),
    ("granite", "<think>I'm\nthinking</think>" + HELLO, False, HELLO, "I'm\nthinking", []),
    ("granite", '<|tool_call|>[{"name": "special_function", "arguments": {"arg1": 1}}]',
     False, "", "", CALL),
    ("nemotron-v2", "I'm\nthinking\n</think>\n<TOOLCALL>[{\"name\": \"special_function\", "
     '"arguments": {"arg1": 1}}]</TOOLCALL>', True, "", "I'm\nthinking", CALL),
    ("seed-oss", "<seed:think>I'm thinking about the answer</seed:think>\nHello, world!",
     False, "Hello, world!", "I'm thinking about the answer", []),
    ("seed-oss", "<seed:tool_call>\n<function=special_function>\n<parameter=arg1>1"
     "</parameter>\n</function>\n</seed:tool_call>", False, "", "", CALL),
    ("functionary-v3.1", '<function=special_function>{"arg1": 1}</function>', False, "", "",
     CALL),
    ("functionary-v3.2", "all\n" + HELLO, False, HELLO, "", []),
    ("functionary-v3.2", 'special_function\n{"arg1": 1}', False, "", "", CALL),
    ("firefunction-v2", ' functools[{"name": "special_function", "arguments": {"arg1": 1}}]',
     False, "", "", CALL),
    ("apriel", '<tool_calls>[{"name": "special_function", "arguments": {"arg1": 1}}]'
     "</tool_calls>", False, "", "", CALL),
    ("lfm2", "<think>I'm\nthinking</think><|tool_call_start|>[special_function(arg1=1)]"
     "<|tool_call_end|>", False, "", "I'm\nthinking", CALL),
    ("lfm2", "<think>I need to call a function</think>Let me check the time."
     '<|tool_call_start|>[get_time(city="Paris")]<|tool_call_end|>', False,
     "Let me check the time.", "I need to call a function", [("get_time", {"city": "Paris"})]),
    ("generic", '{"tool_call": {"name": "special_function", "arguments": {"arg1": 1}}}', False,
     "", "", CALL),
    ("generic", '{"response": "Caf\\u00e9 \\"au lait\\"\\nis {good}"}', False,
     'Café "au lait"\nis {good}', "", []),
]


def _whole(family, text, opened):
    parsed = Reading(FAMILIES[family], TOOLS, opened=opened).parse(text, partial=False)
    return (parsed.content, parsed.reasoning,
            [(c.name, json.loads(c.arguments)) for c in parsed.calls])


def _streamed(family, text, opened, step):
    stream = FormatStream(Reading(FAMILIES[family], TOOLS, opened=opened))
    events = []
    for i in range(0, len(text), step):
        events += stream.feed(text[i:i + step])
    events += stream.finish()
    content = "".join(e.text for e in events if isinstance(e, Text))
    reasoning = "".join(e.text for e in events if isinstance(e, Reasoning))
    names = [e.name for e in events if isinstance(e, CallStart)]
    args = ["".join(e.text for e in events if isinstance(e, CallArgs) and e.index == i)
            for i in range(len(names))]
    return content, reasoning, [(n, json.loads(a)) for n, a in zip(names, args)], events


@pytest.mark.parametrize("family, text, opened, content, reasoning, calls", VECTORS)
def test_answers_are_read_whole_in_their_family_format(family, text, opened, content,
                                                       reasoning, calls):
    assert _whole(family, text, opened) == (content, reasoning, calls)


@pytest.mark.parametrize("step", [1, 5])
@pytest.mark.parametrize("family, text, opened, content, reasoning, calls", VECTORS)
def test_streamed_answers_read_the_same_and_never_leak_a_marker(family, text, opened, content,
                                                                reasoning, calls, step):
    *got, events = _streamed(family, text, opened, step)
    assert got == [content, reasoning, calls]
    markers = FAMILIES[family].markers()
    for event in events:
        if isinstance(event, (Text, Reasoning)):
            assert not any(m in event.text for m in markers if len(m) > 2), event


def test_reasoning_left_inline_when_asked():
    reading = Reading(FAMILIES["qwen3"], None, separate=False)
    parsed = reading.parse("<think>hm</think>Paris", partial=False)
    assert parsed.content == "<think>hm</think>Paris" and parsed.reasoning == ""


def test_arguments_stream_in_pieces_as_they_are_written():
    *_, events = _streamed("hermes", '<tool_call>{"name": "get_time", "arguments": '
                                     '{"city": "Paris"}}</tool_call>', False, 4)
    pieces = [e.text for e in events if isinstance(e, CallArgs)]
    assert len(pieces) > 3 and "".join(pieces) == '{"city": "Paris"}'
    assert isinstance(events[0], CallStart) and events[0].id.startswith("call_")


@pytest.mark.parametrize("template, family", [
    ("{{ '<|start|>assistant<|channel|>final<|message|>' }}", "harmony"),
    ("<think>{{ x }}</think><tool_call>", "qwen3"),
    ("<tool_call>{{ tools }}", "hermes"),
    ("[TOOL_CALLS]{{ name }}[ARGS]", "mistral-small-3.2"),
    ("[TOOL_CALLS]", "mistral-nemo"),
    ("<|start_header_id|>{% if tools %}", "llama3"),
    ("<｜Assistant｜><think>", "deepseek-r1-distill"),
    ("{{ messages }}", "generic"),
])
def test_families_are_told_by_their_templates(template, family):
    assert detect(template).name == family


def test_the_reasoning_tracker_forces_the_closing_marker_once_the_budget_is_spent():
    from engine.batching.budget import ReasoningBudget

    budget = ReasoningBudget(3, "<think>", "</think>", False, [7, 8])
    assert [budget.after(p) for p in ("<th", "ink>", "a", "b")] == [[], [], [], []]
    assert budget.inside and budget.after("c") == [7, 8] and not budget.inside
    untimed = ReasoningBudget(None, "<think>", "</think>", True, [7])
    assert all(untimed.after(p) == [] for p in "thinking") and untimed.inside
    assert untimed.after("</think>") == [] and not untimed.inside
    plain = ReasoningBudget(1, "<think>", "</think>", False, [7])
    assert plain.after("Paris") == [] and not plain.inside and plain.after("x") == []


@pytest.mark.parametrize("template, expected", [
    ("<think></think><tool_call>{% if enable_thinking is defined %}{% endif %}",
     ("reasoning", "tools", "thinking_toggle")),
    ("<|channel|>analysis{{ reasoning_effort }}", ("reasoning", "tools", "reasoning_effort")),
    ("<tool_call>", ("tools",)),
    ("{{ messages }}", ()),
])
def test_capabilities_are_read_from_the_template(template, expected):
    from engine.formats.families import capabilities

    assert capabilities(template) == expected
