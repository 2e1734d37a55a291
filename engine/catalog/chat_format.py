"""Chat prompt formatting: the model's own Jinja template from its GGUF metadata.

A model without a template gets its architecture's known format, and the result says a
fallback was used (llama-cpp-python silently falls back to "llama-2" instead).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from jinja2 import TemplateError, nodes
from jinja2.ext import Extension

from ..errors import InvalidRequest, TemplateStopped
from ..kept import Kept
from ..formats.families import GENERIC, Family, detect
from .gguf_file import GGUFInfo
from .template_budget import BoundedEnvironment, BudgetExceeded, render
from .template_polyfills import LADDER

GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{% set first_user_prefix = '' %}"
    "{% if messages[0]['role'] == 'system' %}"
    "{% set first_user_prefix = messages[0]['content'] + '\n\n' %}"
    "{% set messages = messages[1:] %}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else 'user' %}"
    "{{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else '')"
    " + message['content'] | trim + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Known formats by architecture, with the text that ends a turn in each.
_FALLBACKS = {
    "gemma": ("gemma", GEMMA_TEMPLATE, ("<end_of_turn>",)),
    "gemma2": ("gemma", GEMMA_TEMPLATE, ("<end_of_turn>",)),
    "gemma3": ("gemma", GEMMA_TEMPLATE, ("<end_of_turn>",)),
}
_DEFAULT_FALLBACK = ("chatml", CHATML_TEMPLATE, ("<|im_end|>",))

# End-of-turn markers worth stopping on when a template uses them.
_KNOWN_TURN_ENDS = ("<|im_end|>", "<end_of_turn>", "<|eot_id|>", "<|end|>", "<|endoftext|>")


@dataclass(frozen=True)
class ChatFormat:
    name: str
    template: str
    bos_token: str
    eos_token: str
    fallback: bool
    turn_ends: tuple[str, ...]
    family: Family = GENERIC

    def render(self, messages: list[dict], tools: list[dict] | None = None,
               kwargs: dict | None = None) -> str:
        """The prompt; `tools` reach the template as Hugging Face's apply_chat_template
        passes them (templates that know tools describe them to the model), and only when
        there are some: Hermes 2 Pro, Hermes 3 and Command-R+ loop over `tools` whenever
        it is defined, None included. `kwargs`: the request's chat_template_kwargs
        (enable_thinking, reasoning_effort...).

        What a template lacks is supplied (template_polyfills.LADDER, one more rewrite at
        a time); a template that still raises is the request's 400 in its own words: it
        is the model file's code. A template that runs past its budget (template_budget)
        is a 400 at once, not tried again."""
        extra = dict(kwargs or {})
        if "functions" in self.template and "functions" not in extra:  # firefunction v2
            extra["functions"] = json.dumps([t["function"] for t in tools or ()])
        if "datetime" in self.template and "datetime" not in extra:  # firefunction v2 too
            extra["datetime"] = datetime.now().strftime("%b %d %Y %H:%M:%S GMT")
        first_error = None
        for rung in range(len(LADDER) + 1):
            adapted, offered = messages, tools
            for polyfill in LADDER[:rung]:
                adapted, offered = polyfill(adapted, offered)
            try:
                return self._render(adapted, {**extra, **({"tools": offered}
                                                         if offered is not None else {})})
            except BudgetExceeded as exc:
                raise TemplateStopped(f"the chat template of the model file was stopped: "
                                      f"{exc}", param="messages") from None
            except Exception as exc:  # noqa: BLE001 (any error of the template's own code)
                first_error = first_error or exc
        raise _refusal(first_error)

    def _render(self, messages: list[dict], extra: dict) -> str:
        return render(_compile(self.template), messages=messages, add_generation_prompt=True,
                      bos_token=self.bos_token, eos_token=self.eos_token, **extra)

    def describe(self) -> str:
        if self.fallback:
            return f"{self.name} (fallback: the model file has no chat template)"
        return f"{self.name} (from the model file; {self.family.name} format)"


def _refusal(exc: Exception) -> InvalidRequest:
    if isinstance(exc, TemplateError):
        return InvalidRequest(f"the model's chat template rejected these messages: {exc}",
                              param="messages")
    return InvalidRequest(f"the model's chat template failed on these messages: "
                          f"{type(exc).__name__}: {exc}", param="messages")


def _tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """Hugging Face's tojson (templates pass it json.dumps' arguments); a filter's
    generator (`tools | map(...)`) is the list it yields."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys, default=_listed)


def _listed(value):
    if isinstance(value, Iterable):
        return list(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class _Generation(Extension):
    """Hugging Face's `{% generation %}...{% endgeneration %}` (it marks the assistant's
    tokens for training): here it renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def _raise_exception(message: str):
    raise TemplateError(message)


# Compiled templates, bounded in bytes: a template is a model file's (or a request's)
# text of any size, and its compiled code takes about ten times it.
_compiled: Kept = Kept(64 << 20)


def _compile(template: str):
    found = _compiled.get(template)
    if found is None:
        found = _compiled_anew(template)
        _compiled.put(template, found, 10 * len(template))
    return found


def _compiled_anew(template: str):
    # The same environment settings Hugging Face uses for chat templates.
    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                             extensions=["jinja2.ext.loopcontrols", _Generation])
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    return env.from_string(template)


def chat_format_for(info: GGUFInfo) -> ChatFormat:
    bos, eos = info.bos_token or "", info.eos_token or ""
    if info.chat_template:
        family = detect(info.chat_template)
        ends = family.ends or tuple(t for t in _KNOWN_TURN_ENDS if t in info.chat_template)
        return ChatFormat("model template", info.chat_template, bos, eos, False, ends, family)
    name, template, ends = _FALLBACKS.get(info.architecture, _DEFAULT_FALLBACK)
    return ChatFormat(name, template, bos, eos, True, ends)
