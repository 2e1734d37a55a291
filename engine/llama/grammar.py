"""JSON Schema -> GBNF with llama-cpp-python's converter (`llama_cpp.llama_grammar.
SchemaConverter`, llama.cpp's json-schema-to-grammar), for schemas conversation/json_schema.py
checked first: this room loads llama.cpp, the conversation room does not."""

from __future__ import annotations

import json

from llama_cpp.llama_grammar import SchemaConverter

from ..conversation.compose import Composed
from ..conversation.json_schema import MAX_GRAMMAR, MAX_NESTING, Branch, nesting, typed
from ..errors import InvalidRequest

# A JSON string's character: this converter's rule lets raw control characters (a
# newline) into strings, which JSON parsers reject; llama.cpp's newer one excludes them.
STRICT_CHAR = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'


def grammar(branches: list[Branch], param: str,
            thinking: tuple[str, str] | None = None) -> str:
    """A GBNF grammar whose root is any one of the branches; with `thinking` (a family's
    reasoning markers) the model may reason first, in its own markers, as llama.cpp's
    lazy grammars let it (the opening marker may already be in the prompt)."""
    converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False,
                                raw_pattern=False)
    alternatives = []
    for i, branch in enumerate(branches):
        try:
            schema = converter.resolve_refs(typed(branch.schema), f"b{i}")
            rule = converter.visit(schema, f"b{i}")
        except (AssertionError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise InvalidRequest(f"{param}: cannot be turned into a grammar: {exc}",
                                 param=param) from None
        parts = [_literal(branch.before), rule, _literal(branch.after)]
        body = " ".join(p for p in parts if p)
        alternatives.append(f"({body})+" if branch.repeat else f"({body})")
    root = " | ".join(alternatives)
    if thinking is not None:
        converter._add_rule("reasoning", _reasoning_rule(*thinking))
        root = f"reasoning? ({root})"
    converter._add_rule("root", root)
    if "char" in converter._rules:
        converter._rules["char"] = STRICT_CHAR
    text = converter.format_grammar()
    if len(text) > MAX_GRAMMAR:
        raise InvalidRequest(f"{param}: the grammar these schemas make is {len(text):,} "
                             f"characters; constrained output allows {MAX_GRAMMAR:,}",
                             param=param)
    if (depth := nesting(text)) > MAX_NESTING:
        raise InvalidRequest(f"{param}: the grammar these schemas make nests {depth:,} "
                             f"groups deep; constrained output allows {MAX_NESTING:,}",
                             param=param)
    return text


def _reasoning_rule(opening: str, closing: str) -> str:
    """Reasoning between the markers (the opening one optional): any text that does not
    begin the closing marker's first two characters, then the closing marker."""
    a, b = (_class_char(c) for c in closing[:2])
    return (f"{_literal(opening)}? ([^{a}] | \"{_string_char(closing[0])}\" [^{b}])* "
            f"{_literal(closing)} [ \\t\\n]*")


def _class_char(ch: str) -> str:
    return "\\" + ch if ch in "]\\^-[" else ch


def _string_char(ch: str) -> str:
    return "\\" + ch if ch in '"\\' else ch


def _literal(text: str) -> str:
    return json.dumps(text) if text else ""


def composed_grammar(composed: Composed, param: str = "tools") -> str | None:
    """The grammar a composed conversation's output must follow; None: it is free."""
    return grammar(list(composed.branches), param, composed.thinking) if composed.branches \
        else None
