"""Chat templates rendered under a budget: a model file's template is code from whoever
made the file, and Jinja's sandbox bounds what it may touch, not how long it runs or how
much it makes (`{% for i in range(99999) %}{% for j in range(99999) %}` still ran after
20 s; `{{ 'a' * 3000000000 }}` asks for 3 GB).

Every block the template runs (a loop's body each time round, an `if`'s branch, a macro)
counts one step against MAX_STEPS, and the clock is read every CLOCK_EVERY steps against
MAX_SECONDS; repetition and concatenation (`*`, `+`) may not make more than MAX_CHARS,
powers stay small, and format widths (`%`, `format`, `str.format`) too; the text made is
counted as it is made. Past any of these the render stops with `BudgetExceeded`."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sized

from jinja2.compiler import CodeGenerator
from jinja2.filters import do_format
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_STEPS = 1_000_000  # blocks run in one render (a 1,000-message chat takes thousands)
MAX_SECONDS = 5.0
MAX_CHARS = 16 << 20  # of the prompt, and of any one value made on the way
CLOCK_EVERY = 1000
_WIDE_FORMAT = re.compile(r"%[-#0 +]*(\*|\d{5,}|\.\d{5,})|\{[^{}]*:[^{}]*\d{5,}[^{}]*\}")


class BudgetExceeded(Exception):
    """A template that ran past its budget; the message says which bound."""


class _Budget(threading.local):
    steps = 0
    deadline = 0.0


_budget = _Budget()


class _CountedCode(CodeGenerator):
    """Jinja's code generator, with a step counted at the head of every block."""

    def blockvisit(self, nodes, frame) -> None:
        self.writeline("environment.step()")
        super().blockvisit(nodes, frame)


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    code_generator_class = _CountedCode
    intercepted_binops = frozenset({"*", "+", "**", "%"})

    def __init__(self, **options):
        super().__init__(**options)
        self.filters["format"] = _format_filter

    @staticmethod
    def step() -> None:
        _budget.steps += 1
        if _budget.steps > MAX_STEPS:
            raise BudgetExceeded(f"it ran more than {MAX_STEPS:,} steps")
        if _budget.steps % CLOCK_EVERY == 0 and time.monotonic() > _budget.deadline:
            raise BudgetExceeded(f"it ran longer than {MAX_SECONDS:g} s")

    def call_binop(self, context, operator: str, left, right):
        if operator == "*":
            _check_repeat(left, right)
            _check_repeat(right, left)
        elif operator == "+" and isinstance(left, Sized) and isinstance(right, Sized):
            _check_length(len(left) + len(right))
        elif operator == "**" and abs(_number(right)) > 64 and abs(_number(left)) > 1:
            raise BudgetExceeded(f"it raises a number to the power {right}")
        elif operator == "%" and isinstance(left, str):
            _check_format(left)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (Jinja's own names)
        __self.step()
        wrapped = getattr(__obj, "__wrapped__", None)  # str.format, as the sandbox wraps it
        if isinstance(getattr(wrapped, "__self__", None), str):
            _check_format(wrapped.__self__)
        return super().call(__context, __obj, *args, **kwargs)


def render(template, **variables) -> str:
    """`template` (compiled by a BoundedEnvironment) rendered within the budget."""
    _budget.steps, _budget.deadline = 0, time.monotonic() + MAX_SECONDS
    made, size = [], 0
    for piece in template.generate(**variables):
        size += len(piece)
        if size > MAX_CHARS:
            raise BudgetExceeded(f"it made more than {MAX_CHARS:,} characters")
        made.append(piece)
    return "".join(made)


def _number(value) -> float:
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


def _check_repeat(sequence, times) -> None:
    if isinstance(sequence, Sized) and isinstance(times, int):
        _check_length(len(sequence) * times)


def _check_length(length: int) -> None:
    if length > MAX_CHARS:
        raise BudgetExceeded(f"it makes a value of {length:,} items (at most {MAX_CHARS:,})")


def _check_format(text: str) -> None:
    if _WIDE_FORMAT.search(text):
        raise BudgetExceeded("it formats a value to a width of 10,000 or more")


def _format_filter(value, *args, **kwargs):
    _check_format(str(value))
    return do_format(value, *args, **kwargs)
