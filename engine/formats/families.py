"""The model families and how to tell them from their chat templates: each family's
reasoning markers, tool-call syntax, the markers its answer may carry that are not the
answer, and the texts that end its turn.

Detection reads the template's own text, as llama.cpp's chat.cpp does: the markers a
template writes for past reasoning and calls are the ones its model was trained on."""

from __future__ import annotations

import re
from dataclasses import dataclass

from . import harmony
from .parsed import Parsed
from .scan import without, without_held
from .tool_syntax import JsonCalls, NamedCalls, PythonCalls, Schemas, XmlCalls

THINK = ("<think>", "</think>")


@dataclass(frozen=True)
class Forced:
    """How a family writes a call, for the grammar of a forced one: an object
    {name_key, arguments_key} (in a JSON array when `array`) between `before` and `after`,
    or, when `named`, the arguments alone after a head naming the function (`{name}`)."""
    before: str = ""
    after: str = ""
    arguments_key: str = "arguments"
    name_key: str = "name"
    array: bool = False
    named: bool = False
    several: bool = True  # calls may follow one another (harmony: a call ends the turn)


@dataclass(frozen=True)
class Family:
    name: str
    tools: object | None = None           # a tool_syntax reader; None: no native syntax
    think: tuple[str, str] | None = None  # reasoning's opening and closing markers
    drop: tuple[str, ...] = ()            # markers around the answer, not part of it
    ends: tuple[str, ...] | None = None   # what ends a turn (None: the known turn ends)
    is_harmony: bool = False
    signs: tuple[str, ...] = ()  # texts a template of this family holds, all of them
    forced: Forced | None = None  # how a forced call is written (None: no grammar for it)

    @property
    def native(self) -> bool:
        """The template describes tools and past calls itself (else they are described
        in the system message and the answer is JSON under a grammar: GENERIC_CALLS)."""
        return self.tools is not None or self.is_harmony

    @property
    def calls(self):
        return self.tools if self.tools is not None else GENERIC_CALLS

    def markers(self) -> tuple[str, ...]:
        """Every control text the reader must see (rendered even where it is a control
        token of the vocabulary, which the user never sees)."""
        if self.is_harmony:
            return harmony.MARKERS
        tool_marks = self.calls.markers()
        return tuple(dict.fromkeys((*(self.think or ()), *tool_marks, *self.drop)))

    def opens_thinking(self, prompt: str) -> bool:
        """The generation prompt leaves the model inside its reasoning (DeepSeek R1's
        `<think>\\n`): the answer begins as reasoning without an opening marker."""
        return self.think is not None and prompt.rstrip().endswith(self.think[0].rstrip())

    def parse(self, text: str, partial: bool, *, separate: bool = True, opened: bool = False,
              schemas: Schemas | None = None) -> Parsed:
        """`text` (a whole answer, or so far when `partial`) as content, reasoning and
        calls; `separate`: reasoning apart (else left in the content, as written);
        `schemas`: the offered tools (None: no tools, calls are not read)."""
        if self.is_harmony:
            return harmony.parse(text, partial, separate)
        reasoning, rest = self._thinking(text, partial, opened) if separate else ("", text)
        calls = ()
        if schemas is not None:
            rest, calls = self.calls.split(rest, partial, schemas)
        elif partial:
            rest = without_held(rest, self.markers(), partial)
        rest = without(rest, self.drop)
        if partial:
            rest = without_held(rest, self.drop, partial)
        return Parsed(rest.strip(), reasoning.strip(), calls)

    def _thinking(self, text: str, partial: bool, opened: bool) -> tuple[str, str]:
        if self.think is None:
            return "", text
        opening, closing = self.think
        body = text
        if not opened:
            stripped = text.lstrip()
            if stripped.startswith(opening):
                body = stripped[len(opening):]
            elif partial and stripped and opening.startswith(stripped):
                return "", ""  # may yet open
            else:
                return "", text
        end = body.find(closing)
        if end < 0:
            return without_held(body, (closing,), partial), ""
        return body[:end], body[end + len(closing):]


GENERIC = Family("generic")
GENERIC_CALLS = JsonCalls(at_start=("{",), response_key=True)  # under the generic grammar

_QWEN_XML = XmlCalls(("<tool_call>", "<function="), re.compile(r"<function=(?P<name>[^>\n]+)>"),
                     re.compile(r"<parameter=(?P<key>[^>\n]+)>(?P<value>.*?)</parameter>", re.S),
                     "</function>")
_MISTRAL_CALLS = NamedCalls(("[TOOL_CALLS]",), re.compile(
    r"\[TOOL_CALLS\](?P<name>[^\[\s]+)(?:\[CALL_ID\](?P<id>[^\[]*))?\[ARGS\]"))
_HERMES_CALL = Forced("<tool_call>\n", "\n</tool_call>")

# In order: a template is of the first family whose signs it holds (the more specific first).
FAMILIES = {f.name: f for f in (
    # think: for a forced call's grammar only (the harmony reader has its own channels)
    Family("harmony", think=("<|channel|>analysis<|message|>", "<|end|><|start|>assistant"),
           is_harmony=True, ends=harmony.ENDS, signs=("<|channel|>",),
           forced=Forced("<|channel|>commentary to=functions.{name} <|constrain|>json"
                         "<|message|>", named=True, several=False)),
    Family("kimi-k2", NamedCalls(
        ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"),
        re.compile(r"<\|tool_call_begin\|>\s*(?:functions\.)?(?P<name>[^:<\s]+)(?::\d+)?\s*"
                   r"<\|tool_call_argument_begin\|>")),
        THINK, drop=("<|tool_calls_section_end|>",), signs=("<|tool_calls_section_begin|>",),
        forced=Forced("<|tool_calls_section_begin|><|tool_call_begin|>functions.{name}:0"
                      "<|tool_call_argument_begin|>",
                      "<|tool_call_end|><|tool_calls_section_end|>", named=True)),
    Family("deepseek-r1", NamedCalls(
        ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"),
        re.compile(r"<｜tool▁call▁begin｜>function<｜tool▁sep｜>(?P<name>[^\n]+)\n```json\n")),
        THINK, signs=("function<｜tool▁sep｜>",),
        forced=Forced("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                      "{name}\n```json\n", "```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
                      named=True)),
    Family("deepseek-v3.1", NamedCalls(
        ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"),
        re.compile(r"<｜tool▁call▁begin｜>(?P<name>[^<]+?)<｜tool▁sep｜>")), THINK,
        signs=("<｜tool▁calls▁begin｜>",),
        forced=Forced("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>",
                      "<｜tool▁call▁end｜><｜tool▁calls▁end｜>", named=True)),
    Family("deepseek-v3.2", XmlCalls(
        ("<｜DSML｜function_calls>",), re.compile(r'<｜DSML｜invoke name="(?P<name>[^"]+)">'),
        re.compile(r'<｜DSML｜parameter name="(?P<key>[^"]+)"[^>]*>(?P<value>.*?)'
                   r'</｜DSML｜parameter>', re.S), "</｜DSML｜invoke>"), THINK, signs=("DSML",)),
    Family("minimax-m2", XmlCalls(
        ("<minimax:tool_call>",), re.compile(r'<invoke name="(?P<name>[^"]+)">'),
        re.compile(r'<parameter name="(?P<key>[^"]+)">(?P<value>.*?)</parameter>', re.S),
        "</invoke>"), THINK, signs=("<minimax:tool_call>",)),
    Family("seed-oss", XmlCalls(("<seed:tool_call>",), _QWEN_XML.head, _QWEN_XML.param,
                                "</function>"), ("<seed:think>", "</seed:think>"),
           signs=("<seed:tool_call>",)),
    Family("glm-4.5", XmlCalls(
        ("<tool_call>",), re.compile(r"<tool_call>(?P<name>[^\n<]+?)\s*(?=\n|<)"),
        re.compile(r"<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>(?P<value>.*?)</arg_value>",
                   re.S), "</tool_call>"), THINK, signs=("<arg_key>",)),
    Family("qwen3-coder", _QWEN_XML, THINK, signs=("<parameter=",)),
    Family("functionary-v3.2", NamedCalls((">>>",), re.compile(r">>>(?P<name>[^\n>]+)\n"),
                                          preamble=">>>"),
           signs=(">>>",), forced=Forced("{name}\n", named=True)),
    Family("functionary-v3.1", NamedCalls(("<function=",),
                                          re.compile(r"<function=(?P<name>[^>]+)>")),
           drop=("</function>",), signs=("<function=",),
           forced=Forced("<function={name}>", "</function>", named=True)),
    Family("firefunction-v2", JsonCalls(("functools[",)), signs=("functools",),
           forced=Forced(" functools", array=True)),
    Family("command-r7b", JsonCalls(("<|START_ACTION|>",)),
           ("<|START_THINKING|>", "<|END_THINKING|>"),
           drop=("<|START_RESPONSE|>", "<|END_RESPONSE|>"), signs=("<|START_ACTION|>",),
           forced=Forced("<|START_ACTION|>", "<|END_ACTION|>", "parameters", "tool_name",
                         array=True)),
    Family("command-r-plus", JsonCalls(("Action:",)), signs=("<|CHATBOT_TOKEN|>",)),
    Family("nemotron-v2", JsonCalls(("<TOOLCALL>",)), THINK, signs=("<TOOLCALL>",),
           forced=Forced("<TOOLCALL>", "</TOOLCALL>", array=True)),
    Family("granite", JsonCalls(("<|tool_call|>",)), THINK, drop=("<response>", "</response>"),
           signs=("<|tool_call|>",), forced=Forced("<|tool_call|>", array=True)),
    Family("apriel", JsonCalls(("<tool_calls>",)), ("<thinking>", "[BEGIN FINAL RESPONSE]"),
           signs=("<tool_calls>",), forced=Forced("<tool_calls>", "</tool_calls>", array=True)),
    Family("lfm2", PythonCalls("<|tool_call_start|>", "<|tool_call_end|>"), THINK,
           signs=("<|tool_call_start|>",)),
    Family("magistral", _MISTRAL_CALLS, ("[THINK]", "[/THINK]"), signs=("[ARGS]", "[THINK]"),
           forced=Forced("[TOOL_CALLS]{name}[ARGS]", named=True)),
    Family("mistral-small-3.2", _MISTRAL_CALLS, signs=("[ARGS]",),
           forced=Forced("[TOOL_CALLS]{name}[ARGS]", named=True)),
    Family("mistral-nemo", JsonCalls(("[TOOL_CALLS]",), at_start=("[{",)),
           signs=("[TOOL_CALLS]",), forced=Forced("[TOOL_CALLS]", array=True)),
    Family("qwen3", JsonCalls(("<tool_call>",)), THINK, drop=("</tool_call>",),
           signs=("<tool_call>", "</think>"), forced=_HERMES_CALL),
    Family("hermes", JsonCalls(("<tool_call>",)), drop=("</tool_call>",),
           signs=("<tool_call>",), forced=_HERMES_CALL),
    Family("llama3", JsonCalls(("<|python_tag|>",), at_start=("{",)),
           signs=("<|start_header_id|>", "tools"), forced=Forced(arguments_key="parameters")),
    Family("deepseek-r1-distill", None, THINK, signs=("<｜Assistant｜>",)),
    Family("thinking", None, THINK, signs=("</think>",)),
    GENERIC,
)}


def detect(template: str | None) -> Family:
    """The family a chat template belongs to, read from the markers it writes."""
    text = template or ""
    for family in FAMILIES.values():
        if family.signs and all(sign in text for sign in family.signs):
            return family
    return GENERIC


def capabilities(template: str | None) -> tuple[str, ...]:
    """What a chat template says its model can do: "reasoning" (it thinks in markers its
    family separates), "tools" (it calls tools in its own syntax), and which reasoning
    control it takes ("reasoning_effort": low to high; "thinking_toggle": on or off)."""
    family, text = detect(template), template or ""
    found = []
    if family.think or family.is_harmony or "enable_thinking" in text:
        found.append("reasoning")
    if family.native:
        found.append("tools")
    if "reasoning_effort" in text:
        found.append("reasoning_effort")
    if "enable_thinking" in text or family.name.startswith("deepseek"):
        found.append("thinking_toggle")
    return tuple(found)
