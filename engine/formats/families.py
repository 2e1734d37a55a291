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
from .scan import without_held
from .tool_syntax import JsonCalls, NamedCalls, PythonCalls, Schemas, XmlCalls

THINK = ("<think>", "</think>")


@dataclass(frozen=True)
class Family:
    name: str
    tools: object | None = None           # a tool_syntax reader; None: no native syntax
    think: tuple[str, str] | None = None  # reasoning's opening and closing markers
    drop: tuple[str, ...] = ()            # markers around the answer, not part of it
    ends: tuple[str, ...] | None = None   # what ends a turn (None: the known turn ends)
    is_harmony: bool = False

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
        for marker in self.drop:
            rest = rest.replace(marker, "")
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
            return (without_held(body, (closing,), partial), "")
        return body[:end], body[end + len(closing):]


GENERIC = Family("generic", think=None)
GENERIC_CALLS = JsonCalls(at_start=("{",), response_key=True)  # under the generic grammar

_QWEN_XML = XmlCalls(("<tool_call>", "<function="), re.compile(r"<function=(?P<name>[^>\n]+)>"),
                     re.compile(r"<parameter=(?P<key>[^>\n]+)>(?P<value>.*?)</parameter>", re.S),
                     "</function>")

FAMILIES = {f.name: f for f in (
    # think: for a forced call's grammar only (the harmony reader has its own channels)
    Family("harmony", think=("<|channel|>analysis<|message|>", "<|end|><|start|>assistant"),
           is_harmony=True, ends=harmony.ENDS),
    Family("kimi-k2", NamedCalls(
        ("<|tool_calls_section_begin|>", "<|tool_call_begin|>"),
        re.compile(r"<\|tool_call_begin\|>\s*(?:functions\.)?(?P<name>[^:<\s]+)(?::\d+)?\s*"
                   r"<\|tool_call_argument_begin\|>")),
        THINK, drop=("<|tool_calls_section_end|>",)),
    Family("deepseek-r1", NamedCalls(
        ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"),
        re.compile(r"<｜tool▁call▁begin｜>function<｜tool▁sep｜>(?P<name>[^\n]+)\n```json\n")),
        THINK),
    Family("deepseek-v3.1", NamedCalls(
        ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>"),
        re.compile(r"<｜tool▁call▁begin｜>(?P<name>[^<]+?)<｜tool▁sep｜>")), THINK),
    Family("deepseek-v3.2", XmlCalls(
        ("<｜DSML｜function_calls>",), re.compile(r'<｜DSML｜invoke name="(?P<name>[^"]+)">'),
        re.compile(r'<｜DSML｜parameter name="(?P<key>[^"]+)"[^>]*>(?P<value>.*?)'
                   r'</｜DSML｜parameter>', re.S), "</｜DSML｜invoke>"), THINK),
    Family("minimax-m2", XmlCalls(
        ("<minimax:tool_call>",), re.compile(r'<invoke name="(?P<name>[^"]+)">'),
        re.compile(r'<parameter name="(?P<key>[^"]+)">(?P<value>.*?)</parameter>', re.S),
        "</invoke>"), THINK),
    Family("seed-oss", XmlCalls(("<seed:tool_call>",), _QWEN_XML.head, _QWEN_XML.param,
                                "</function>"), ("<seed:think>", "</seed:think>")),
    Family("glm-4.5", XmlCalls(
        ("<tool_call>",), re.compile(r"<tool_call>(?P<name>[^\n<]+?)\s*(?=\n|<)"),
        re.compile(r"<arg_key>(?P<key>.*?)</arg_key>\s*<arg_value>(?P<value>.*?)</arg_value>",
                   re.S), "</tool_call>"), THINK),
    Family("qwen3-coder", _QWEN_XML, THINK),
    Family("functionary-v3.2", NamedCalls((">>>",), re.compile(r">>>(?P<name>[^\n>]+)\n"),
                                          preamble=">>>")),
    Family("functionary-v3.1", NamedCalls(("<function=",),
                                          re.compile(r"<function=(?P<name>[^>]+)>")),
           drop=("</function>",)),
    Family("firefunction-v2", JsonCalls(("functools[",))),
    Family("command-r7b", JsonCalls(("<|START_ACTION|>",)),
           ("<|START_THINKING|>", "<|END_THINKING|>"),
           drop=("<|START_RESPONSE|>", "<|END_RESPONSE|>")),
    Family("command-r-plus", JsonCalls(("Action:",))),
    Family("nemotron-v2", JsonCalls(("<TOOLCALL>",)), THINK),
    Family("granite", JsonCalls(("<|tool_call|>",)), THINK, drop=("<response>", "</response>")),
    Family("apriel", JsonCalls(("<tool_calls>",)), ("<thinking>", "[BEGIN FINAL RESPONSE]")),
    Family("lfm2", PythonCalls("<|tool_call_start|>", "<|tool_call_end|>"), THINK),
    Family("magistral", NamedCalls(
        ("[TOOL_CALLS]",), re.compile(r"\[TOOL_CALLS\](?P<name>[^\[\s]+)"
                                      r"(?:\[CALL_ID\](?P<id>[^\[]*))?\[ARGS\]")),
        ("[THINK]", "[/THINK]")),
    Family("mistral-small-3.2", NamedCalls(
        ("[TOOL_CALLS]",), re.compile(r"\[TOOL_CALLS\](?P<name>[^\[\s]+)"
                                      r"(?:\[CALL_ID\](?P<id>[^\[]*))?\[ARGS\]"))),
    Family("mistral-nemo", JsonCalls(("[TOOL_CALLS]",), at_start=("[{",))),
    Family("hermes", JsonCalls(("<tool_call>",)), drop=("</tool_call>",)),
    Family("qwen3", JsonCalls(("<tool_call>",)), THINK, drop=("</tool_call>",)),
    Family("llama3", JsonCalls(("<|python_tag|>",), at_start=("{",))),
    Family("deepseek-r1-distill", None, THINK),
    Family("thinking", None, THINK),
    GENERIC,
)}

# In order: the first whose markers the template holds (more specific ones first).
_SIGNS = (
    ("harmony", ("<|channel|>",)),
    ("kimi-k2", ("<|tool_calls_section_begin|>",)),
    ("deepseek-r1", ("function<｜tool▁sep｜>",)),
    ("deepseek-v3.1", ("<｜tool▁calls▁begin｜>",)),
    ("deepseek-v3.2", ("DSML",)),
    ("minimax-m2", ("<minimax:tool_call>",)),
    ("seed-oss", ("<seed:tool_call>",)),
    ("glm-4.5", ("<arg_key>",)),
    ("qwen3-coder", ("<parameter=",)),
    ("functionary-v3.2", (">>>",)),
    ("functionary-v3.1", ("<function=",)),
    ("firefunction-v2", ("functools",)),
    ("command-r7b", ("<|START_ACTION|>",)),
    ("command-r-plus", ("<|CHATBOT_TOKEN|>",)),
    ("nemotron-v2", ("<TOOLCALL>",)),
    ("granite", ("<|tool_call|>",)),
    ("apriel", ("<tool_calls>",)),
    ("lfm2", ("<|tool_call_start|>",)),
    ("magistral", ("[ARGS]", "[THINK]")),
    ("mistral-small-3.2", ("[ARGS]",)),
    ("mistral-nemo", ("[TOOL_CALLS]",)),
    ("qwen3", ("<tool_call>", "</think>")),
    ("hermes", ("<tool_call>",)),
    ("llama3", ("<|start_header_id|>", "tools")),
    ("deepseek-r1-distill", ("<｜Assistant｜>",)),
    ("thinking", ("</think>",)),
)


def detect(template: str | None) -> Family:
    """The family a chat template belongs to, read from the markers it writes."""
    text = template or ""
    for name, signs in _SIGNS:
        if all(sign in text for sign in signs):
            return FAMILIES[name]
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
