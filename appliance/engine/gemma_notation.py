"""Gemma's tool-call notation (Gemma 4's and FunctionGemma's): the grammar of a call's arguments
for their JSON Schema, and the reader that turns written arguments back into JSON values.

Gemma 4's chat template writes a value (its `format_argument`) as a string between `<|"|>` marks
(FunctionGemma's between `<escape>` marks),
a number, `true`/`false`, a list `[a,b]` or an object `{key:value,...}` with bare keys in sorted
order (its `dictsort`), and no whitespace anywhere; a null comes out as Python's `None`, read here
as `null` too. The grammar holds a value to its schema: types (and lists of them), `enum` and
`const`, an object's `properties` in sorted order with the `required` ones always present (no
others), `items`, `minItems` of one or more, integer `minimum`/`maximum`, `anyOf`/`oneOf`,
`nullable`, local `$ref`s and a string's `minLength`/`maxLength`. A string's `pattern` and
`format`, a list's `maxItems` and `additionalProperties` schemas are not enforced (a string's text
is free between its marks, but for the marks themselves); the keywords the JSON grammar refuses
(engine/schema_grammar.py) are refused here too. Pure Python.
"""

from __future__ import annotations

import re
from typing import Any, Callable

from .schema_grammar import (EXPONENT, MAX_RULES, REFUSED_KEYWORDS, SchemaError, integer_bounds, integer_range,
                             literal, merged_all_of, never_spelling, resolve_ref)

QUOTE = '<|"|>'
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_KEY = re.compile(r"[^:{}\[\],<]+")
_WORDS = {"true": True, "false": False, "null": None, "None": None}
_EXPONENT = EXPONENT.replace("{", "{{").replace("}", "}}")  # these rules are format strings

# Any value, for schemas that do not say more ({quote} is the string mark's grammar element).
_ANY = {
    "g-value": "g-string | g-object | g-list | g-number | g-bool | g-null",
    "g-string": "{quote} g-char* {quote}",
    # a character of a string: the text of the mark never comes out of these, even where the
    # mark is one token (whose text the characters would otherwise match)
    "g-char": "{char}",
    "g-object": '"{{" (g-pair ("," g-pair)*)? "}}"',
    "g-pair": r'[^:{{}}\[\],<]+ ":" g-value',
    "g-list": r'"[" (g-value ("," g-value)*)? "]"',
    "g-number": r'"-"? ("0" | [1-9] [0-9]{{0,15}}) ("." [0-9]{{1,16}})? (' + _EXPONENT + ')?',
    "g-bool": '"true" | "false"',
    "g-null": '"null" | "None"',
}


class NotationError(ValueError):
    """Text that is not a value in Gemma 4's notation."""


def read(text: str, mark: str = QUOTE) -> Any:
    """The JSON value `text` writes (all of it), its strings between `mark`s; NotationError where
    it does not read."""
    value, end = _value(text, 0, mark)
    if end != len(text):
        raise NotationError(f"text after the value at {end}")
    return value


def _value(text: str, i: int, mark: str) -> tuple[Any, int]:
    if text.startswith(mark, i):
        end = text.find(mark, i + len(mark))
        if end < 0:
            raise NotationError("a string without its closing mark")
        return text[i + len(mark):end], end + len(mark)
    if text.startswith("{", i):
        return _object(text, i + 1, mark)
    if text.startswith("[", i):
        return _list(text, i + 1, mark)
    for word, value in _WORDS.items():
        if text.startswith(word, i):
            return value, i + len(word)
    m = _NUMBER.match(text, i)
    if m is None:
        raise NotationError(f"no value at {i}")
    number = m.group()
    return (float(number) if any(c in number for c in ".eE") else int(number)), m.end()


def _object(text: str, i: int, mark: str) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}

    def pair(i: int) -> int:
        m = _KEY.match(text, i)
        if m is None or not text.startswith(":", m.end()):
            raise NotationError(f"no key at {i}")
        out[m.group()], end = _value(text, m.end() + 1, mark)
        return end

    return out, _items(text, i, "}", pair)


def _list(text: str, i: int, mark: str) -> tuple[list[Any], int]:
    out: list[Any] = []

    def item(i: int) -> int:
        value, end = _value(text, i, mark)
        out.append(value)
        return end

    return out, _items(text, i, "]", item)


def _items(text: str, i: int, close: str, read_one: Callable[[int], int]) -> int:
    """Reads comma-separated items from `i` up to `close` (`read_one` reads one and says where
    it ends); where the text goes on after `close`."""
    if text.startswith(close, i):
        return i + 1
    while True:
        i = read_one(i)
        if text.startswith(",", i):
            i += 1
        elif text.startswith(close, i):
            return i + 1
        else:
            raise NotationError(f"no ',' or {close!r} at {i}")


def write(value: Any) -> str:
    """`value` as Gemma 4's template writes it (keys sorted, no whitespace)."""
    if isinstance(value, str):
        return QUOTE + value + QUOTE
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{write(v)}" for k, v in sorted(value.items())) + "}"
    if isinstance(value, list):
        return "[" + ",".join(write(v) for v in value) + "]"
    return str(value)


def _join(path: str, key: str | int) -> str:
    return f"{path}.{key}" if path else str(key)


class _Converter:
    def __init__(self, quote: str, mark: str):
        self.quote = quote
        self.mark = mark
        self.rules: dict[str, str] = {}
        self.refs: dict[tuple[int, str], str] = {}
        self.root: Any = None
        self.any_used = False

    def rule(self, name: str, body: str) -> str:
        base, k = re.sub(r"[^a-zA-Z0-9]+", "-", name).strip("-").lower() or "r", 1
        name = base
        while name in self.rules:
            k += 1
            name = f"{base}-{k}"
        if len(self.rules) >= MAX_RULES:
            raise SchemaError("", f"the schema needs more than {MAX_RULES} grammar rules")
        self.rules[name] = body
        return name

    def any(self, kind: str = "value") -> str:
        self.any_used = True
        return f"g-{kind}"

    def visit(self, schema: Any, path: str, hint: str) -> str:
        if schema is True or schema == {}:
            return self.any()
        if not isinstance(schema, dict):
            raise SchemaError(path, f"a schema must be an object or true, got {schema!r}")
        for key, why in REFUSED_KEYWORDS.items():
            if key in schema:
                raise SchemaError(_join(path, key), why)
        if "$ref" in schema:
            return self.ref(schema["$ref"], path)
        if "allOf" in schema:
            return self.visit(merged_all_of(schema, path), path, hint)
        alts: list[str]
        for key in ("anyOf", "oneOf"):
            if key in schema:
                if not isinstance(schema[key], list) or not schema[key]:
                    raise SchemaError(_join(path, key), "must be a non-empty array of schemas")
                alts = [self.visit(s, _join(_join(path, key), i), f"{hint}-{i}") for i, s in enumerate(schema[key])]
                break
        else:
            if "const" in schema:
                alts = [self.constant(schema["const"], _join(path, "const"))]
            elif "enum" in schema:
                if not isinstance(schema["enum"], list) or not schema["enum"]:
                    raise SchemaError(_join(path, "enum"), "must be a non-empty array")
                alts = [self.constant(v, _join(path, "enum")) for v in schema["enum"]]
            else:
                types = schema.get("type")
                if types is None:
                    types = ["object"] if "properties" in schema else ["array"] if "items" in schema else None
                if types is None:
                    return self.any()
                alts = [self.typed(schema, t, path, hint) for t in ([types] if isinstance(types, str) else types)]
        if schema.get("nullable") is True:
            alts.append(self.any("null"))
        return alts[0] if len(alts) == 1 else self.rule(hint, " | ".join(alts))

    def constant(self, value: Any, path: str) -> str:
        if isinstance(value, str):
            return f"{self.quote} {literal(value)} {self.quote}"
        if isinstance(value, (bool, int, float)) or value is None:
            return literal(write(value))
        raise SchemaError(path, "only strings, numbers, booleans and null are supported here")

    def typed(self, schema: dict, kind: str, path: str, hint: str) -> str:
        if kind == "string":
            lo = schema.get("minLength", 0)
            hi = schema.get("maxLength")
            if not lo and hi is None:
                return self.any("string")
            self.any_used = True
            repeat = f"{{{lo},{hi if hi is not None else ''}}}"
            return self.rule(f"{hint}-string", f"{self.quote} g-char{repeat} {self.quote}")
        if kind == "integer":
            lo, hi = integer_bounds(schema, path)
            return self.rule(f"{hint}-int", integer_range(lo, hi))
        if kind in ("number", "boolean", "null"):
            return self.any({"boolean": "bool"}.get(kind, kind))
        if kind == "array":
            return self.array(schema, path, hint)
        if kind == "object":
            return self.object(schema, path, hint)
        raise SchemaError(_join(path, "type"), f"{kind!r} is not a JSON Schema type")

    def array(self, schema: dict, path: str, hint: str) -> str:
        items = schema.get("items")
        if items is None or items is True:
            item = self.any()
        elif isinstance(items, dict):
            item = self.visit(items, _join(path, "items"), f"{hint}-item")
        else:
            raise SchemaError(_join(path, "items"), "must be a schema")
        more = f'"," {item}'
        body = f"{item} ({more})*"
        return self.rule(hint, f'"[" {body} "]"' if schema.get("minItems", 0) >= 1 else f'"[" ({body})? "]"')

    def object(self, schema: dict, path: str, hint: str) -> str:
        props = schema.get("properties")
        if not props:
            return self.any("object")
        if not isinstance(props, dict):
            raise SchemaError(_join(path, "properties"), "must be an object")
        required = schema.get("required") or []
        pairs = []
        for key in sorted(props):  # the template writes keys sorted
            value = self.visit(props[key], _join(_join(path, "properties"), key), f"{hint}-{key}")
            pairs.append((f'{literal(key + ":")} {value}', key in required))
        # tail: the pairs from i on after one was written (each with its comma); head: before any
        tail = head = ""
        for i in range(len(pairs) - 1, -1, -1):
            pair, needed = pairs[i]
            first = f"{pair} {tail}".strip()
            head = first if needed else (f"({first} | {head})" if head else f"({first})?")
            step = f'"," {pair}'
            tail = (f"{step} {tail}" if needed else f"({step})? {tail}").strip()
            if i:
                tail = self.rule(f"{hint}-after-{i}", tail)
        return self.rule(hint, f'"{{" {head} "}}"')

    def ref(self, ref: Any, path: str) -> str:
        key = (id(self.root), ref)
        if key in self.refs:
            return self.refs[key]
        target = resolve_ref(self.root, ref, path)
        name = self.rule(f"ref-{ref}", "")  # named first: the reference may be recursive
        self.refs[key] = name
        self.rules[name] = self.visit(target, _join(path, "$ref"), name)
        return name

    def lines(self) -> str:
        out = [f"{name} ::= {body}" for name, body in self.rules.items()]
        if self.any_used:
            char = never_spelling(self.mark)
            out += [f"{name} ::= {body.format(quote=self.quote, char=char)}" for name, body in _ANY.items()]
        return "\n".join(out) + "\n"


def schemas_gbnf(schemas: list[Any], hint: str, quote: str, mark: str = QUOTE) -> tuple[str, list[str]]:
    """Rules (no `root`) for the values of several schemas in Gemma's notation, each schema a
    document of its own ($refs resolve in it), and each one's expression. `mark` is the string
    mark's text and `quote` its grammar element: a token reference (`<[id]>`) where the
    vocabulary has it as one token, else the text. A SchemaError's path starts with the schema's
    index."""
    conv = _Converter(quote, mark)
    tops = []
    for i, schema in enumerate(schemas):
        conv.root = schema
        try:
            tops.append(conv.visit(schema, str(i), f"{hint}-{i}"))
        except RecursionError:
            raise SchemaError(str(i), "the schema is nested too deeply") from None
    return conv.lines(), tops
