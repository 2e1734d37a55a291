"""JSON Schema -> GBNF for llama.cpp's grammar sampler, with llama-cpp-python's converter
(`llama_cpp.llama_grammar.SchemaConverter`, llama.cpp's json-schema-to-grammar).

That converter skips what it does not know (a "minimum", a "format": "email", a "not")
and would then let through output the schema forbids. So every keyword is checked first
against the ones it enforces, and anything else is a 400 that names the keyword and
where it is: a constraint is applied whole or refused, never silently loosened.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import jsonschema
from llama_cpp.llama_grammar import SchemaConverter

from ..errors import InvalidRequest

# Keywords the converter turns into grammar rules.
ENFORCED = {"type", "properties", "required", "additionalProperties", "items", "prefixItems",
            "minItems", "maxItems", "enum", "const", "anyOf", "$ref", "$defs", "definitions",
            "pattern", "format", "minLength", "maxLength"}
# Keywords that constrain nothing.
ANNOTATIONS = {"title", "description", "default", "examples", "$schema", "$id", "$comment",
               "deprecated", "readOnly", "writeOnly", "strict"}
FORMATS = {"date", "time", "date-time", "uuid"}
TYPES = {"object", "array", "string", "number", "integer", "boolean", "null"}
# A JSON string's character: this converter's rule lets raw control characters (a
# newline) into strings, which JSON parsers reject; llama.cpp's newer one excludes them.
STRICT_CHAR = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])'
# Keywords whose value is a map of names to schemas, or a list of schemas.
_SCHEMA_MAPS = {"properties", "$defs", "definitions"}
_SCHEMA_LISTS = {"anyOf", "prefixItems"}


def check(schema, param: str, strict: bool = True) -> list[str]:
    """Raise InvalidRequest (naming `param` and the place) unless `schema` is JSON Schema
    whose every keyword the grammar enforces. Not `strict` (a tool's parameters: agents
    such as Claude Code send `format: uri` and the like), such keywords are returned, to
    be reported, instead of refused."""
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{param} must be a JSON Schema object", param=param)
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = "/".join(str(p) for p in exc.path)
        raise InvalidRequest(f"{param} is not valid JSON Schema"
                             f"{' at ' + where if where else ''}: {exc.message}",
                             param=param) from None
    unenforced = []
    for problem, always in _problems(schema, param):
        if strict or always:
            raise problem
        unenforced.append(problem.param)
    return unenforced


def _problems(schema, where: str):
    """(InvalidRequest, refused even in a tool's schema) for each keyword the grammar
    cannot enforce, in the order of the schema."""
    if not isinstance(schema, dict):
        if schema is not True:
            yield InvalidRequest(f"{where}: boolean schema false cannot be enforced",
                                 param=where), True
        return
    for key, value in schema.items():
        if key in ANNOTATIONS:
            continue
        if key not in ENFORCED:
            hint = " (use anyOf)" if key == "oneOf" else ""
            yield InvalidRequest(f"{where}: the schema keyword {key!r} is not supported in "
                                 f"constrained output{hint}", param=f"{where}.{key}"), False
            continue
        if key == "format" and value not in FORMATS:
            yield InvalidRequest(f"{where}: format {value!r} is not supported (supported: "
                                 f"{', '.join(sorted(FORMATS))})", param=f"{where}.format"), False
        if key == "$ref" and not str(value).startswith("#/"):
            yield InvalidRequest(f"{where}: only local references (#/...) are supported, "
                                 f"not {value!r}", param=f"{where}.$ref"), True
        for sub, at in _subschemas(key, value, where):
            yield from _problems(sub, at)
    missing = set(schema.get("required", ())) - set(schema.get("properties", {}))
    if missing and schema.get("additionalProperties", False) is False:
        yield InvalidRequest(f"{where}: required names {sorted(missing)} that its properties "
                             "do not define", param=f"{where}.required"), False
    if ("minItems" in schema or "maxItems" in schema) and isinstance(schema.get("items"), list):
        yield InvalidRequest(f"{where}: minItems/maxItems with a tuple of items is not "
                             "supported", param=f"{where}.items"), False


def _subschemas(key: str, value, where: str):
    """The schemas inside keyword `key`, with their places."""
    if key in _SCHEMA_MAPS:
        return [(sub, f"{where}.{key}.{name}") for name, sub in value.items()]
    if key in _SCHEMA_LISTS:
        return [(sub, f"{where}.{key}[{i}]") for i, sub in enumerate(value)]
    if key == "items":
        if isinstance(value, list):
            return [(sub, f"{where}.items[{i}]") for i, sub in enumerate(value)]
        return [(value, f"{where}.items")]
    if key == "additionalProperties" and isinstance(value, dict):
        return [(value, f"{where}.additionalProperties")]
    return []


@dataclass(frozen=True)
class Branch:
    """One way the output may go: literal text, then JSON valid against `schema`, then
    literal text (a tool call's tags around its JSON; both empty for plain JSON)."""
    schema: dict
    before: str = ""
    after: str = ""
    repeat: bool = False  # one or more times (several tool calls in a row)


def grammar(branches: list[Branch], param: str) -> str:
    """A GBNF grammar whose root is any one of the branches."""
    converter = SchemaConverter(prop_order={}, allow_fetch=False, dotall=False,
                                raw_pattern=False)
    alternatives = []
    for i, branch in enumerate(branches):
        try:
            schema = converter.resolve_refs(json.loads(json.dumps(branch.schema)), f"b{i}")
            rule = converter.visit(schema, f"b{i}")
        except (AssertionError, ValueError, KeyError, TypeError) as exc:
            raise InvalidRequest(f"{param}: cannot be turned into a grammar: {exc}",
                                 param=param) from None
        parts = [_literal(branch.before), rule, _literal(branch.after)]
        body = " ".join(p for p in parts if p)
        alternatives.append(f"({body})+" if branch.repeat else f"({body})")
    converter._add_rule("root", " | ".join(alternatives))
    if "char" in converter._rules:
        converter._rules["char"] = STRICT_CHAR
    return converter.format_grammar()


def _literal(text: str) -> str:
    return json.dumps(text) if text else ""


def any_object() -> dict:
    return {"type": "object"}
