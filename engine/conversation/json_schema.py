"""JSON Schema checked before it becomes a GBNF grammar for llama.cpp's grammar sampler
(the conversion, with llama-cpp-python's converter, is llama/grammar.py), and the
branches a grammar is made of.

The converter skips what it does not know (a "minimum", a "format": "email", a "not")
and would then let through output the schema forbids. So every keyword is checked first
against the ones it enforces, and anything else is a 400 that names the keyword and
where it is: a constraint is applied whole or refused, never silently loosened.

Schemas are untrusted input (an agent passes on an MCP server's tool schemas), and a
grammar can crash the process: the converter writes a repetition of up to n as n nested
groups, which llama.cpp's recursive parser descends one stack frame each (maxLength
50,000 overflowed the stack: SIGSEGV). So every repetition (minLength, maxLength,
minItems, maxItems, {m,n} in a pattern) is bounded by MAX_REPEAT, the schema's nesting by
MAX_DEPTH, an object's properties by MAX_PROPERTIES, the work of converting it by
MAX_COST, and the grammar's size by MAX_GRAMMAR. Measured: on a 512 KiB thread stack
(macOS's default) a maxLength of 1,000 parses and 1,200 overflows; the engine's worker
thread, which parses grammars, has 16 MiB (batching/lane.py) on every system.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import jsonschema

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
MAX_REPEAT = 1000  # the largest repetition count in a schema or pattern
MAX_DEPTH = 64  # schemas inside schemas
MAX_PROPERTIES = 256  # in one object (the converter recurses once per optional property)
MAX_COST = 20_000  # repetitions and schemas, added up over the whole schema
MAX_PATTERN = 1000  # characters of a pattern
MAX_GRAMMAR = 512 * 1024  # characters of the grammar made from all of a request's schemas
# Groups inside groups in the grammar: each is a frame of llama.cpp's recursive parser. A
# repetition of MAX_REPEAT nests about as deep; measured on a 512 KiB stack, 1,000 parse.
MAX_NESTING = MAX_REPEAT + 2 * MAX_DEPTH
_REPEAT_KEYS = ("minLength", "maxLength", "minItems", "maxItems")
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
    _check_size(schema, param)  # first: jsonschema's own check recurses as deep as it goes
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


def bounded(schema, param: str) -> tuple[object, list[str]]:
    """A tool's parameters with every length or count bound over MAX_REPEAT left out (a
    grammar cannot hold it; Claude Code's tools ask for strings of 524,288 characters),
    and the places left out, to be reported as unenforced. Only for schemas that need
    not be enforced whole (check's `strict=False`): the answer's own schema is refused."""
    schema, left = copy.deepcopy(schema), []
    todo = [(schema, param, 0)]
    while todo:
        sub, where, depth = todo.pop()
        if not isinstance(sub, dict) or depth > MAX_DEPTH:  # (too deep: check refuses it)
            continue
        for key in _REPEAT_KEYS:
            if isinstance(sub.get(key), int) and sub[key] > MAX_REPEAT:
                del sub[key]
                left.append(f"{where}.{key}")
        todo += [(inner, at, depth + 1) for key, value in sub.items()
                 for inner, at in _subschemas(key, value, where)]
    return schema, left


def typed(schema) -> object:
    """The schema with each subschema that constrains nothing (empty, or annotations
    alone: Claude Code's `{"description": ...}`) made any JSON value, as JSON Schema means
    it: the converter reads `{}` as an object and refuses a description alone ("value" is
    its rule for any JSON value)."""
    schema = copy.deepcopy(schema)
    todo = [schema]
    while todo:
        sub = todo.pop()
        if not isinstance(sub, dict):
            continue
        if not set(sub) - ANNOTATIONS:
            sub.clear()
            sub["type"] = "value"
            continue
        todo += [inner for key, value in sub.items() for inner, _ in _subschemas(key, value, "")]
    return schema


def _check_size(schema, param: str) -> None:
    """Refuse (naming the place) a schema whose grammar would be too deep or too large for
    llama.cpp's parser, before the converter spends any time or memory on it."""
    cost = 0
    for sub, where, depth in _walk(schema, param, 0):
        if depth > MAX_DEPTH:
            raise InvalidRequest(f"{where}: schemas are nested more than {MAX_DEPTH} deep",
                                 param=where)
        if isinstance(sub, dict) and len(sub.get("properties") or ()) > MAX_PROPERTIES:
            raise InvalidRequest(f"{where}: {len(sub['properties'])} properties; constrained "
                                 f"output allows at most {MAX_PROPERTIES} in one object",
                                 param=f"{where}.properties")
        for key, count in _repetitions(sub, where):
            if count > MAX_REPEAT:
                raise InvalidRequest(f"{where}: {key} is {count}; constrained output allows "
                                     f"at most {MAX_REPEAT}", param=f"{where}.{key}")
            cost += count
        cost += 1
        if cost > MAX_COST:
            raise InvalidRequest(f"{where}: the schema is too large for constrained output "
                                 f"(over {MAX_COST} schemas and repetitions in all)", param=where)


def _walk(schema, where: str, depth: int):
    """(schema, its place, its depth) for `schema` and every schema inside it."""
    yield schema, where, depth
    if isinstance(schema, dict):
        for key, value in schema.items():
            for sub, at in _subschemas(key, value, where):
                yield from _walk(sub, at, depth + 1)


def _repetitions(schema, where: str):
    """(keyword, count) for each repetition `schema` asks for, {m,n} in its pattern too."""
    if not isinstance(schema, dict):
        return
    for key in _REPEAT_KEYS:
        if isinstance(schema.get(key), int):
            yield key, schema[key]
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        if len(pattern) > MAX_PATTERN:
            raise InvalidRequest(f"{where}: the pattern is over {MAX_PATTERN} characters",
                                 param=f"{where}.pattern")
        for number in quantifiers(pattern):
            yield "pattern", abs(number)
        product = nested_repetition(pattern)
        if product > MAX_REPEAT:  # each level multiplies the grammar's parse stacks
            raise InvalidRequest(f"{where}: the pattern's nested repetitions multiply to "
                                 f"{product:,}; constrained output allows at most "
                                 f"{MAX_REPEAT}", param=f"{where}.pattern")


def quantifiers(pattern: str) -> list[int]:
    """Every number in the {m}, {m,} and {m,n} of `pattern`, read exactly as the converter
    reads them (its scan of the pattern, then `int()`, which also takes "+7", "7_000" and
    other scripts' digits): a number it would use cannot slip past the bound."""
    return [n for kind, counts in _pieces(pattern) if kind == "{" for n in counts]


def nested_repetition(pattern: str) -> int:
    """The largest product of {m,n} counts nested in one another in `pattern`: 99³ for
    ((a{9,99}){9,99}){9,99}. Each level of optional repetition multiplies the stacks
    llama.cpp's grammar sampler keeps, and its time per token grows without end while
    every single count stays under MAX_REPEAT. A group's value is the largest product
    inside it; a quantifier multiplies the value of the atom before it."""
    frames, last = [1], 1  # the largest product in each open group; the last atom's
    for kind, counts in _pieces(pattern):
        if kind == "(":
            frames.append(1)
        elif kind == ")" and len(frames) > 1:
            last = frames.pop()
            frames[-1] = max(frames[-1], last)
        elif kind == "{":
            last *= max((abs(n) for n in counts), default=1)
            frames[-1] = max(frames[-1], last)
        else:
            last = 1
    return max(frames)


def _pieces(pattern: str):
    """`pattern` as the converter scans it: ("(", None), (")", None), ("{", the numbers
    of a quantifier), and ("atom", None) for anything else (a character, an escape, a
    class). An unbalanced "{" ends it: the converter refuses the pattern."""
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "{":
            end = pattern.find("}", i)
            if end < 0:
                return
            yield "{", _numbers(pattern[i + 1:end])
            i = end
        elif c in "()":
            yield c, None
        else:
            if c == "\\":
                i += 1
            elif c == "[":  # a class: the converter copies it up to "]", braces and all
                i += 1
                while i < len(pattern) and pattern[i] != "]":
                    i += 2 if pattern[i] == "\\" else 1
            yield "atom", None
        i += 1


def _numbers(inside: str) -> list[int]:
    numbers = []
    for part in inside.split(","):
        try:
            numbers.append(int(part.strip()))
        except ValueError:
            pass  # the converter refuses it too, or reads it as empty
    return numbers


def nesting(grammar_text: str) -> int:
    """How deep the groups of a GBNF grammar nest: parentheses outside its literals,
    classes and comments, as llama.cpp's parser descends them."""
    deepest = depth = 0
    i, n = 0, len(grammar_text)
    while i < n:
        c = grammar_text[i]
        if c in "\"[":
            close = "\"" if c == "\"" else "]"
            i += 1
            while i < n and grammar_text[i] != close:
                i += 2 if grammar_text[i] == "\\" else 1
        elif c == "#":
            while i < n and grammar_text[i] != "\n":
                i += 1
        elif c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth -= 1
        i += 1
    return deepest


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
        if key == "enum" and value == []:
            yield InvalidRequest(f"{where}: an empty enum allows no value at all",
                                 param=f"{where}.enum"), True
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
    if key in _SCHEMA_MAPS and isinstance(value, dict):
        return [(sub, f"{where}.{key}.{name}") for name, sub in value.items()]
    if key in _SCHEMA_LISTS and isinstance(value, list):
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


def any_object() -> dict:
    return {"type": "object"}
