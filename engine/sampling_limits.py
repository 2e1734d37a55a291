"""The bounds of the sampling fields, written once: the API's bodies (OpenAI's and the
rest, Ollama's options) are validated against them, and a model's own generation
settings are taken only within them (catalog/sampling_defaults.py)."""

from __future__ import annotations

from typing import Annotated, Any

from annotated_types import Ge, Gt, Le

Temperature = Annotated[float, Ge(0), Le(2)]
TopP = Annotated[float, Gt(0), Le(1)]
TopK = Annotated[int, Ge(0)]
MinP = Annotated[float, Ge(0), Le(1)]
Penalty = Annotated[float, Ge(-2), Le(2)]  # frequency and presence

BY_FIELD = {"temperature": Temperature, "top_p": TopP, "top_k": TopK, "min_p": MinP,
            "frequency_penalty": Penalty, "presence_penalty": Penalty}


def within(field: str, value: Any) -> bool:
    """Whether `value` is a number `field` may take."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    checks = {Ge: lambda b: value >= b.ge, Gt: lambda b: value > b.gt,
              Le: lambda b: value <= b.le}
    return all(checks[type(bound)](bound) for bound in BY_FIELD[field].__metadata__)
