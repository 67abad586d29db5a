"""JSON Schema to a GBNF grammar (llama.cpp's grammar format) for structured output.

What the grammar enforces: types (and lists of types), `enum`, `const`, `properties` in their
declared order with `required` ones always present, `additionalProperties` (only when it is
`true` or a schema: a schema with `properties` and no `additionalProperties` gets no others, as
llama.cpp's converter does), `items`, `prefixItems`, `minItems`/`maxItems`, `minLength`/
`maxLength`, `pattern` (regex_grammar.py), integer `minimum`/`maximum`/`exclusiveMinimum`/
`exclusiveMaximum`, `anyOf`/`oneOf` (as alternatives: exclusivity is not enforced), a
one-element `allOf`, local `$ref`s (recursive ones too), OpenAPI's `nullable`, and the string
formats date, time, date-time and uuid. Keywords beside `$ref`, `anyOf`/`oneOf` or a one-element
`allOf` hold too (merged into the referenced schema, or into every alternative); beside
`enum`/`const` only `type` may stand (it keeps the values of that type). Other formats are
annotations (JSON Schema's default), as are title, description, default, examples.

A keyword that constrains values in a way the grammar cannot (multipleOf, number bounds, not,
if/then/else, a lookahead in a pattern, ...) raises SchemaError naming its path, never silently
dropped. Whitespace between tokens is bounded and strings cannot hold raw control characters,
so every completed output parses with a strict JSON parser. Pure Python: no llama.cpp here.
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable

from .regex_grammar import RegexError, pattern_gbnf

# {OWN_ROOT: schema} stands for `schema` with its $refs resolved against itself (a tool's
# parameters inside a schema built around them); the path of an error in it starts there.
OWN_ROOT = "x-eie-own-root"
# llama.cpp treats a repetition bound above this as unbounded and refuses a minimum above it.
MAX_REPEAT = 2000
MAX_DIGITS = 16
MAX_RULES = 5000

# A number's exponent: at most 289, so that every number the grammar spells (16 digits before
# the point) is a finite double; `[0-9]{1,3}` let `9e999` through, which strict JSON parsers
# refuse and others read as infinity.
EXPONENT = r'[eE] [-+]? ([0-9]{1,2} | "1" [0-9]{2} | "2" [0-8] [0-9])'

PRIMITIVES: dict[str, str] = {
    # Bounded whitespace: a small model cannot loop on blanks between two tokens.
    "ws": r'| " " | "\n" [ \t]{0,20}',
    # a \u escape of a UTF-16 surrogate only as a high-low pair: a lone one is no character, and
    # strict parsers (and UTF-8 encoders) refuse it
    "char": r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} '
            r'| [dD] [0-7] [0-9a-fA-F]{2} | [dD] [89abAB] [0-9a-fA-F]{2} "\\u" [dD] [c-fC-F] [0-9a-fA-F]{2}))',
    "string": r'"\"" char* "\"" ws',
    "integer": r'"-"? ("0" | [1-9] [0-9]{0,15}) ws',
    "number": r'"-"? ("0" | [1-9] [0-9]{0,15}) ("." [0-9]{1,16})? (' + EXPONENT + ')? ws',
    "boolean": r'("true" | "false") ws',
    "null": r'"null" ws',
    "value": "object | array | string | number | boolean | null",
    "object": r'"{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws',
    "array": r'"[" ws ( value ("," ws value)* )? "]" ws',
    # the days each month has; February 29 only in leap years (Gregorian: the year's last two
    # digits a multiple of 4 other than 00, or 00 after a first two that are)
    "date": r'[0-9]{4} "-" (("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) '
            r'| ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8])) '
            r'| ([0-9]{2} ("0" [48] | [2468] [048] | [13579] [26]) '
            r'| ("0" [48] | [2468] [048] | [13579] [26] | "00") "00") "-02-29"',
    "time": r'([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,6})? '
            r'("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9])',
    "date-time": r'date "T" time',
    "uuid": r'[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}',
}
# Which primitives each one uses (so the grammar holds only what it needs).
_USES = {
    "string": ("char", "ws"), "integer": ("ws",), "number": ("ws",), "boolean": ("ws",), "null": ("ws",),
    "value": ("object", "array", "string", "number", "boolean", "null"),
    "object": ("ws", "string", "value"), "array": ("ws", "value"), "date-time": ("date", "time"),
}
STRING_FORMATS = ("date", "time", "date-time", "uuid")
TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")

# Keywords that constrain values beyond what a grammar built here enforces: refused, by path.
REFUSED_KEYWORDS = {
    "patternProperties": "not supported",
    "propertyNames": "not supported",
    "not": "not supported",
    "if": "not supported", "then": "not supported", "else": "not supported",
    "dependentRequired": "not supported", "dependentSchemas": "not supported", "dependencies": "not supported",
    "unevaluatedProperties": "not supported", "unevaluatedItems": "not supported",
    "contains": "not supported", "minContains": "not supported", "maxContains": "not supported",
    "multipleOf": "not supported",
    "minProperties": "not supported", "maxProperties": "not supported",
    "$dynamicRef": "not supported", "$dynamicAnchor": "not supported",
    "$recursiveRef": "not supported", "$recursiveAnchor": "not supported",
}
# Keywords that say something about a schema without constraining its values: free beside any
# other keyword (a constraint beside $ref, anyOf/oneOf, enum or const is applied or refused).
ANNOTATIONS = frozenset({"title", "description", "default", "examples", "example", "$comment", "deprecated",
                         "readOnly", "writeOnly", "$schema", "$id", "$defs", "definitions", "$anchor",
                         "discriminator", "externalDocs", "xml", OWN_ROOT})
_NUMBER_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


class SchemaError(ValueError):
    """A schema the grammar cannot express; `path` is the offending key, dotted ('' = root)."""

    def __init__(self, path: str, message: str):
        super().__init__(f"{path or '(root)'}: {message}")
        self.path = path
        self.reason = message


def literal(text: str) -> str:
    """A GBNF string literal that matches `text` exactly."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def never_spelling(mark: str) -> str:
    """A GBNF alternation of one character, or of a proper prefix of `mark` and the character that
    leaves it, so that text built of them never holds `mark` (it does only where a prefix of the
    mark runs into the mark itself, as in "</pa</parameter>"). `mark` must not repeat its first
    character."""
    alts = [f"[^{_class_char(mark[0])}]"]
    alts += [f"{literal(mark[:k])} [^{_class_char(mark[k])}]" for k in range(1, len(mark))]
    return " | ".join(alts)


def _class_char(ch: str) -> str:
    return "\\" + ch if ch in "]\\^-[" else ch


def json_literal(value: Any) -> str:
    return literal(json.dumps(value, ensure_ascii=False))


def _join(path: str, key: str | int) -> str:
    return f"{path}.{key}" if path else str(key)


class _Converter:
    def __init__(self, root: Any):
        self.root = root
        self.rules: dict[str, str] = {}
        self.by_body: dict[str, str] = {}
        self.refs: dict[tuple[int, str], str] = {}  # (id of the document, $ref) -> rule name
        self.used: set[str] = set()

    # ---- rules -------------------------------------------------------------------------------

    def prim(self, name: str) -> str:
        stack = [name]
        while stack:
            n = stack.pop()
            if n not in self.used:
                self.used.add(n)
                stack.extend(_USES.get(n, ()))
        return name

    def rule(self, hint: str, body: str) -> str:
        """A named rule with this body (an identical body reuses its name)."""
        if body in self.by_body:
            return self.by_body[body]
        name = self.fresh(hint)
        self.rules[name] = body
        self.by_body[body] = name
        return name

    def fresh(self, hint: str) -> str:
        base = re.sub(r"[^a-zA-Z0-9]+", "-", hint).strip("-").lower() or "r"
        if base in PRIMITIVES or base == "root":
            base += "-r"
        name, k = base, 1
        while name in self.rules or name in self.refs.values():
            k += 1
            name = f"{base}-{k}"
        if len(self.rules) >= MAX_RULES:
            raise SchemaError("", f"the schema needs more than {MAX_RULES} grammar rules")
        return name

    # ---- schemas -----------------------------------------------------------------------------

    def visit(self, schema: Any, path: str, hint: str) -> str:
        """A grammar expression (a rule name or a short sequence) for values of `schema`."""
        if schema is True or schema == {}:
            return self.prim("value")
        if schema is False:
            raise SchemaError(path, "false allows no value")
        if not isinstance(schema, dict):
            raise SchemaError(path, f"a schema must be an object or a boolean, got {type(schema).__name__}")
        for key, why in REFUSED_KEYWORDS.items():
            if key in schema:
                raise SchemaError(_join(path, key), why)
        if schema.get("uniqueItems") is True:
            raise SchemaError(_join(path, "uniqueItems"), "not supported")
        if OWN_ROOT in schema:  # a document of its own: its $refs resolve against it
            outer, self.root = self.root, schema[OWN_ROOT]
            try:
                return self.visit(self.root, path, hint)
            finally:
                self.root = outer
        nullable = schema.get("nullable") is True
        if "$ref" in schema:
            beside = constraints(schema, ("$ref", "nullable"))
            if beside:  # both hold: the referenced schema with these keywords too
                target = resolve_ref(self.root, schema["$ref"], path)
                try:
                    merged = both(target, {**beside, **({"nullable": True} if nullable else {})},
                                  _join(path, "$ref"), "$ref")
                except _NoValue:
                    raise SchemaError(_join(path, "$ref"), "the referenced schema and the keywords beside it "
                                      "allow no value together") from None
                return self.visit(merged, path, hint)
            name = self.ref(schema, path)
            return self.rule(hint, f"{name} | {self.prim('null')}") if nullable else name
        if "allOf" in schema:
            return self.visit(merged_all_of(schema, path), path, hint)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                alts = schema[key]
                if not isinstance(alts, list) or not alts:
                    raise SchemaError(_join(path, key), "must be a non-empty array of schemas")
                beside = constraints(schema, (key, "nullable"))
                names = []
                for i, a in enumerate(alts):
                    if beside:  # A and (B or C) is (A and B) or (A and C); a branch the rest rules out goes
                        try:
                            a = both(a, beside, _join(_join(path, key), i), key)
                        except _NoValue:
                            continue
                    names.append(self.visit(a, _join(_join(path, key), i), f"{hint}-{i}"))
                if not names:
                    raise SchemaError(_join(path, key), "no alternative allows a value of the schema beside it")
                if nullable:
                    names.append(self.prim("null"))
                return self.rule(hint, " | ".join(names))
        if "const" in schema or "enum" in schema:
            return self.literals(schema, path, hint)
        types = schema.get("type")
        if types is None:
            types = self.implied_types(schema)
        types = type_list(types, path)
        if nullable and "null" not in types:
            types = [*types, "null"]
        names = [self.typed(schema, t, path, hint if len(types) == 1 else f"{hint}-{t}") for t in types]
        return names[0] if len(names) == 1 else self.rule(hint, " | ".join(names))

    def literals(self, schema: dict, path: str, hint: str) -> str:
        """`const` or `enum`: its values, those of the schema's `type` where it has one (the only
        keyword that may stand beside them)."""
        key = "const" if "const" in schema else "enum"
        values = [schema["const"]] if key == "const" else schema["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError(_join(path, "enum"), "must be a non-empty array")
        beside = constraints(schema, ("const", "enum", "type", "nullable"))
        if beside:
            raise SchemaError(_join(path, next(iter(beside))), f"not supported beside {key} (only type is)")
        if "type" in schema:
            types = type_list(schema["type"], path)
            values = [v for v in values if any(has_type(v, t) for t in types)]
            if not values:
                raise SchemaError(_join(path, key), f"no value of {key} is of the type beside it")
        return self.rule(hint, "(" + " | ".join(json_literal(v) for v in values) + ") " + self.prim("ws"))

    @staticmethod
    def implied_types(schema: dict) -> list[str]:
        if "properties" in schema or "additionalProperties" in schema or "required" in schema:
            return ["object"]
        if "items" in schema or "prefixItems" in schema:
            return ["array"]
        return list(TYPES)  # no type: any JSON value

    def typed(self, schema: dict, t: str, path: str, hint: str) -> str:
        if t == "object":
            return self.object(schema, path, hint)
        if t == "array":
            return self.array(schema, path, hint)
        if t == "string":
            return self.string(schema, path, hint)
        if t == "integer":
            return self.integer(schema, path, hint)
        if t == "number":
            for key in _NUMBER_BOUNDS:
                if key in schema:
                    raise SchemaError(_join(path, key), "bounds are supported for integers, not numbers")
        return self.prim(t)

    def ref(self, schema: dict, path: str) -> str:
        ref = schema["$ref"]
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(_join(path, "$ref"), "only local references (#/...) are supported")
        key = (id(self.root), ref)
        if key in self.refs:
            return self.refs[key]
        target = resolve_ref(self.root, ref, path)
        name = self.fresh("ref-" + ref.rsplit("/", 1)[-1])
        self.refs[key] = name  # before the visit: a recursive schema refers to itself
        self.rules[name] = ""
        self.rules[name] = self.visit(target, _join(path, "$ref"), name)
        return name

    def object(self, schema: dict, path: str, hint: str) -> str:
        props = schema.get("properties") or {}
        if not isinstance(props, dict):
            raise SchemaError(_join(path, "properties"), "must be an object")
        required = schema.get("required") or []
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(_join(path, "required"), "must be an array of property names")
        for r in required:
            if r not in props:
                raise SchemaError(_join(path, "required"), f"{r!r} has no schema in properties")
        extra = schema.get("additionalProperties")
        if not props and "additionalProperties" not in schema:
            return self.prim("object")
        ws = self.prim("ws")
        kvs = []
        for key, sub in props.items():
            value = self.visit(sub, _join(_join(path, "properties"), key), f"{hint}-{key}")
            kvs.append((self.rule(f"{hint}-{key}-kv", f'{json_literal(key)} {ws} ":" {ws} {value}'), key in required))
        if extra is not None and extra is not False:
            value = self.visit(extra, _join(path, "additionalProperties"), f"{hint}-additional")
            kv = self.rule(f"{hint}-additional-kv", f'{self.prim("string")} ":" {ws} {value}')
            more = self.rule(f"{hint}-additional-next", f'"," {ws} {kv}')
            tail, head = f"{more}*", f"({kv} {more}*)?"
        else:
            tail, head = "", ""
        # tail(i): properties i.. after one was written (each with its comma); head(i): before any.
        for i in range(len(kvs) - 1, -1, -1):
            kv, req = kvs[i]
            first = f"{kv} {tail}".strip()  # property i, then tail(i + 1)
            if req:
                head = first
            else:
                head = self.rule(f"{hint}-from-{i}", f"{first} | {head}" if head else f"({first})?")
            step = f'"," {ws} {kv}'
            tail = (f"{step} {tail}" if req else f"({step})? {tail}").strip()
            if i:
                tail = self.rule(f"{hint}-after-{i}", tail)
        return self.rule(hint, f'"{{" {ws} {head} "}}" {ws}'.replace("  ", " "))

    def array(self, schema: dict, path: str, hint: str) -> str:
        ws = self.prim("ws")
        prefix = schema.get("prefixItems")
        items = schema.get("items")
        if isinstance(items, list):  # draft 4-7 tuple form
            prefix, items = items, schema.get("additionalItems", False)
        lo, hi = self.count_bounds(schema, "minItems", "maxItems", path)
        if prefix is not None:
            if not isinstance(prefix, list):
                raise SchemaError(_join(path, "prefixItems"), "must be an array of schemas")
            if lo or hi is not None:
                raise SchemaError(_join(path, "minItems" if lo else "maxItems"), "not supported with prefixItems")
            parts = [self.visit(s, _join(_join(path, "prefixItems"), i), f"{hint}-{i}") for i, s in enumerate(prefix)]
            body = f' "," {ws} '.join(parts)
            if items is not None and items is not False:
                value = self.visit(items, _join(path, "items"), f"{hint}-item")
                more = self.rule(f"{hint}-next", f'"," {ws} {value}')
                body = f"{body} {more}*" if parts else f"({value} {more}*)?"
            return self.rule(hint, f'"[" {ws} {body} "]" {ws}')
        value = self.prim("value") if items is None or items is True else self.visit(items, _join(path, "items"), f"{hint}-item")
        if items is False:
            return self.rule(hint, f'"[" {ws} "]" {ws}')
        more = self.rule(f"{hint}-next", f'"," {ws} {value}')
        rest = self.repeat(more, max(lo - 1, 0), None if hi is None else hi - 1)
        if hi == 0:
            inner = ""
        elif lo >= 1:
            inner = f"{value} {rest}"
        else:
            inner = f"({value} {rest})?"
        return self.rule(hint, f'"[" {ws} {inner} "]" {ws}'.replace("  ", " "))

    def string(self, schema: dict, path: str, hint: str) -> str:
        if "pattern" in schema:
            expr, any_start, any_end = checked_pattern(schema, path)
            char = self.prim("char")
            body = " ".join([r'"\""', *([f"{char}*"] if any_start else []), expr,
                             *([f"{char}*"] if any_end else []), r'"\""', self.prim("ws")])
            return self.rule(f"{hint}-pattern", body)
        fmt = checked_format(schema, path)
        if fmt is not None:
            return self.rule(f"{hint}-{fmt}", rf'"\"" {self.prim(fmt)} "\"" {self.prim("ws")}')
        lo, hi = self.count_bounds(schema, "minLength", "maxLength", path)
        if lo == 0 and hi is None:
            return self.prim("string")
        self.prim("string")
        return self.rule(hint, rf'"\"" {self.repeat("char", lo, hi)} "\"" ws')

    def integer(self, schema: dict, path: str, hint: str) -> str:
        lo, hi = integer_bounds(schema, path)
        if lo is None and hi is None:
            return self.prim("integer")
        if lo is not None and hi is not None and lo > hi:
            raise SchemaError(path, f"no integer is >= {lo} and <= {hi}")
        return self.rule(hint, f"({integer_range(lo, hi)}) {self.prim('ws')}")

    @staticmethod
    def count_bounds(schema: dict, lo_key: str, hi_key: str, path: str) -> tuple[int, int | None]:
        lo, hi = schema.get(lo_key, 0), schema.get(hi_key)
        for key, v in ((lo_key, lo), (hi_key, hi)):
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 0):
                raise SchemaError(_join(path, key), "must be a non-negative integer")
        if lo > MAX_REPEAT:
            raise SchemaError(_join(path, lo_key), f"at most {MAX_REPEAT} (llama.cpp's grammar limit)")
        if hi is not None and hi < lo:
            raise SchemaError(_join(path, hi_key), f"{hi} is less than {lo_key} {lo}")
        if hi is not None and hi > MAX_REPEAT:
            hi = None  # llama.cpp reads a larger bound as unbounded; the README says so
        return lo, hi

    @staticmethod
    def repeat(item: str, lo: int, hi: int | None) -> str:
        if hi is None:
            return f"{item}*" if lo == 0 else (f"{item}+" if lo == 1 else f"{item}{{{lo},}}")
        if lo == hi:
            return "" if lo == 0 else (item if lo == 1 else f"{item}{{{lo}}}")
        return f"{item}?" if (lo, hi) == (0, 1) else f"{item}{{{lo},{hi}}}"

    def body(self, name: str) -> str | None:
        if name in self.rules:
            return self.rules[name]
        return PRIMITIVES.get(name) if name in self.used else None

    def trimmed(self, name: str, seen: frozenset[str] = frozenset()) -> str:
        """`name` without the whitespace its values end with, so the output ends at the value."""
        body = self.body(name)
        if body is None or name in seen:
            return name
        alts = split_alternatives(body)
        if len(alts) > 1:
            out = [self.trimmed(a, seen | {name}) if a in self.rules or a in PRIMITIVES else a for a in alts]
            return self.rule(f"{name}-end", " | ".join(out)) if out != alts else name
        if body.endswith(" ws"):
            return self.rule(f"{name}-end", body[: -len(" ws")])
        if " " not in body and self.body(body) is not None:  # an alias: root-value ::= ref-x
            return self.trimmed(body, seen | {name})
        return name

    def grammar(self, top: str) -> str:
        root = f"root ::= {self.trimmed(top)}\n"
        return root + self.rule_lines()

    def rule_lines(self) -> str:
        lines = [f"{name} ::= {body}" for name, body in self.rules.items()]
        lines += [f"{name} ::= {PRIMITIVES[name]}" for name in PRIMITIVES if name in self.used]
        return "\n".join(lines) + "\n"


def merged_all_of(schema: dict, path: str) -> Any:
    """A schema with a one-element `allOf` as that element with the schema's other keys."""
    parts = schema["allOf"]
    if not isinstance(parts, list) or len(parts) != 1:
        raise SchemaError(_join(path, "allOf"), "only a one-element allOf is supported")
    rest = {k: v for k, v in schema.items() if k != "allOf"}
    try:
        return both(parts[0], rest, _join(path, "allOf"), "allOf")
    except _NoValue:
        raise SchemaError(_join(path, "allOf"), "its schema and the one beside it allow no value together") from None


class _NoValue(Exception):
    """Two schemas that allow no value together (their types do not meet)."""


def constraints(schema: dict, handled: tuple[str, ...]) -> dict:
    """The keywords of `schema` that constrain values, but for those `handled` where it is read."""
    return {k: v for k, v in schema.items() if k not in handled and k not in ANNOTATIONS and not k.startswith("x-")}


def type_list(types: Any, path: str) -> list[str]:
    """A schema's `type` as a list of JSON Schema types, or a SchemaError at `path`.type."""
    out = [types] if isinstance(types, str) else types
    if not isinstance(out, list) or not out:
        raise SchemaError(_join(path, "type"), f"must be one of {', '.join(TYPES)} or a list of them")
    for t in out:
        if t not in TYPES:
            raise SchemaError(_join(path, "type"), f"{t!r} is not one of {', '.join(TYPES)}")
    return out


def has_type(value: Any, t: str) -> bool:
    """Whether a JSON value (as Python reads it) is of JSON Schema type `t`."""
    if isinstance(value, bool):
        return t == "boolean"
    if isinstance(value, int):
        return t in ("integer", "number")
    if isinstance(value, float):
        return t == "number" or (t == "integer" and value.is_integer())
    return {str: "string", type(None): "null", list: "array", dict: "object"}.get(type(value)) == t


def _meet(t: str, u: str) -> str | None:
    """The type of the values of both types t and u (None: no value is)."""
    if t == u:
        return t
    return "integer" if {t, u} == {"integer", "number"} else None


def both(schema: Any, extra: dict, path: str, what: str) -> Any:
    """One schema for `schema` and `extra` together (extra's keywords constrain values): their
    types meet (_NoValue where they do not), and another keyword both set differently is refused."""
    if schema is True or schema == {}:
        return dict(extra)
    if schema is False:
        raise _NoValue()
    if not isinstance(schema, dict):
        raise SchemaError(path, f"a schema must be an object or a boolean, got {type(schema).__name__}")
    out = dict(schema)
    for k, v in extra.items():
        if k == "type" and "type" in out:
            met = [m for t in type_list(out["type"], path) for u in type_list(v, path) if (m := _meet(t, u))]
            if not met:
                raise _NoValue()
            out["type"] = list(dict.fromkeys(met))
        elif k in out and out[k] != v and k not in ANNOTATIONS:
            raise SchemaError(_join(path, k), f"set both by the schema and beside its {what}: not supported")
        else:
            out.setdefault(k, v)
    return out


def resolve_ref(root: Any, ref: Any, path: str) -> Any:
    """The schema a local `$ref` (a JSON pointer, #/...) names in `root`."""
    if not isinstance(ref, str) or not ref.startswith("#"):
        raise SchemaError(_join(path, "$ref"), "only local references (#/...) are supported")
    if ref != "#" and not ref.startswith("#/"):  # (it was read as "#", the root)
        raise SchemaError(_join(path, "$ref"), f"{ref!r} names an $anchor: only JSON pointers (#/...) are supported")
    target: Any = root
    for raw in ref[1:].split("/")[1:] if ref != "#" else []:
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(target, dict) and part in target:
            target = target[part]
        elif isinstance(target, list) and part.isdigit() and int(part) < len(target):
            target = target[int(part)]
        else:
            raise SchemaError(_join(path, "$ref"), f"{ref!r} does not resolve in this schema")
    return target


def split_alternatives(body: str) -> list[str]:
    """A rule body's top-level alternatives (outside quotes, classes and parentheses)."""
    alts, depth, start, i = [], 0, 0, 0
    while i < len(body):
        ch = body[i]
        if ch in '"[':
            close = '"' if ch == '"' else "]"
            i += 1
            while i < len(body) and body[i] != close:
                i += 2 if body[i] == "\\" else 1
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "|" and depth == 0:
            alts.append(body[start:i].strip())
            start = i + 1
        i += 1
    alts.append(body[start:].strip())
    return alts


def integer_bounds(schema: dict, path: str) -> tuple[int | None, int | None]:
    """Inclusive integer bounds from minimum/maximum and the exclusive forms (numbers in draft
    6 and later, booleans beside minimum/maximum in draft 4)."""
    import math

    lo = hi = None
    for key in _NUMBER_BOUNDS:
        v = schema.get(key)
        if v is None or isinstance(v, bool):
            continue
        if not isinstance(v, (int, float)) or not math.isfinite(v):
            raise SchemaError(_join(path, key), "must be a finite number")
        if key == "minimum":
            b = math.ceil(v)
            b = b + 1 if schema.get("exclusiveMinimum") is True and b == v else b
            lo = b if lo is None else max(lo, b)
        elif key == "maximum":
            b = math.floor(v)
            b = b - 1 if schema.get("exclusiveMaximum") is True and b == v else b
            hi = b if hi is None else min(hi, b)
        elif key == "exclusiveMinimum":
            b = math.floor(v) + 1
            lo = b if lo is None else max(lo, b)
        else:
            b = math.ceil(v) - 1
            hi = b if hi is None else min(hi, b)
    limit = 10**MAX_DIGITS - 1
    if lo is not None and hi is not None and lo > hi:
        return lo, hi
    return (None if lo is None or lo < -limit else min(lo, limit),
            None if hi is None or hi > limit else max(hi, -limit))


def _same_length(lo: str, hi: str) -> str:
    """Digits of exactly len(lo) == len(hi) spelling a number in [lo, hi]."""
    if not lo:
        return ""
    n = len(lo) - 1
    if lo[1:] == "0" * n and hi[1:] == "9" * n:
        first = f'"{lo[0]}"' if lo[0] == hi[0] else f"[{lo[0]}-{hi[0]}]"
        return first if n == 0 else (f"{first} [0-9]" if n == 1 else f"{first} [0-9]{{{n}}}")
    if lo[0] == hi[0]:
        rest = _same_length(lo[1:], hi[1:])
        return f'"{lo[0]}" {rest}'.strip() if rest else f'"{lo[0]}"'
    alts = []
    low_rest = _same_length(lo[1:], "9" * n)
    alts.append(f'"{lo[0]}" {low_rest}'.strip())
    if int(lo[0]) + 1 <= int(hi[0]) - 1:
        mid = f"[{int(lo[0]) + 1}-{int(hi[0]) - 1}]"
        alts.append(f"{mid} [0-9]{{{n}}}" if n > 1 else (f"{mid} [0-9]" if n == 1 else mid))
    high_rest = _same_length("0" * n, hi[1:])
    alts.append(f'"{hi[0]}" {high_rest}'.strip())
    return "(" + " | ".join(alts) + ")"


def _non_negative(lo: int, hi: int | None) -> list[str]:
    """Alternatives spelling the integers in [lo, hi] (hi None: up to MAX_DIGITS digits), no sign."""
    top = 10**MAX_DIGITS - 1 if hi is None else hi
    alts = []
    for digits in range(len(str(lo)), len(str(top)) + 1):
        a = max(lo, 10 ** (digits - 1) if digits > 1 else 0)
        b = min(top, 10**digits - 1)
        if a > b:
            continue
        if hi is None and a == 10 ** (digits - 1) and digits > 1:
            alts.append(f"[1-9] [0-9]{{{digits - 1},{MAX_DIGITS - 1}}}")  # every longer number
            break
        alts.append(_same_length(str(a), str(b)))
    return alts


def integer_range(lo: int | None, hi: int | None) -> str:
    """A GBNF alternative for the integers in [lo, hi], None meaning unbounded on that side."""
    alts = []
    if lo is None or lo < 0:  # negative part: -m for m in [max(1, -hi), -lo]
        m_lo = 1 if hi is None or hi >= 0 else -hi
        m_hi = None if lo is None else -lo
        alts += [f'"-" {a}' for a in _non_negative(m_lo, m_hi)]
    if hi is None or hi >= 0:
        alts += _non_negative(max(0, lo if lo is not None else 0), hi)
    return " | ".join(alts)


def schema_to_gbnf(schema: Any) -> str:
    """The GBNF grammar (start symbol `root`) for JSON values matching `schema`."""
    conv = _Converter(schema)
    try:
        top = conv.visit(schema, "", "root-value")
    except RecursionError:
        raise SchemaError("", "the schema is nested too deeply") from None
    return conv.grammar(top)


def values_gbnf(schemas: list[Any], hint: str, roots: list[Any] | None = None) -> tuple[str, list[str]]:
    """Rules (no `root`) for the values of several schemas in one grammar, and for each schema the
    expression its values match, ending at the value (no whitespace after it). A schema's $refs
    resolve in its entry of `roots` (a document it is part of), else in itself; a SchemaError's
    path starts with the schema's index."""
    conv = _Converter(None)
    tops = []
    for i, schema in enumerate(schemas):
        conv.root = roots[i] if roots is not None else schema
        try:
            tops.append(conv.trimmed(conv.visit(schema, str(i), f"{hint}-{i}")))
        except RecursionError:
            raise SchemaError(str(i), "the schema is nested too deeply") from None
    return conv.rule_lines(), tops


Parameter = tuple[str, bool, str]  # a property's key, whether it is required, its value's expression


def checked_pattern(schema: dict, path: str, raw: bool = False) -> tuple[str, bool, bool]:
    """A string schema's `pattern` as pattern_gbnf gives it (`raw`: for the string's raw text, not
    its JSON), or a SchemaError at `path` for what a grammar cannot hold with it."""
    pattern = schema["pattern"]
    if not isinstance(pattern, str):
        raise SchemaError(_join(path, "pattern"), "must be a string")
    for key in ("minLength", "maxLength"):
        if key in schema:
            raise SchemaError(_join(path, key), "not supported together with pattern")
    if schema.get("format") in STRING_FORMATS:
        raise SchemaError(_join(path, "format"), "not supported together with pattern")
    try:
        return pattern_gbnf(pattern, raw)
    except RegexError as e:
        raise SchemaError(_join(path, "pattern"), str(e)) from None


def checked_format(schema: dict, path: str) -> str | None:
    """A string schema's `format` where a grammar holds it (one of STRING_FORMATS; None for the
    others, annotations), or a SchemaError at `path` for a length bound beside it."""
    fmt = schema.get("format")
    if fmt not in STRING_FORMATS:
        return None
    for key in ("minLength", "maxLength"):
        if key in schema:
            raise SchemaError(_join(path, key), f"not supported with format {fmt!r}")
    return fmt


def format_expression(fmt: str) -> str:
    """A string format's grammar (one of STRING_FORMATS) as one expression, without quotes: for a
    tool-call format that writes the string as raw text."""
    if fmt == "date-time":
        return f'({format_expression("date")} "T" {format_expression("time")})'
    return f"({PRIMITIVES[fmt]})"


def parameters_gbnf(functions: list[tuple[str, Any]], own: Callable[[str, Any], str | None] = lambda k, s: None,
                    any_value: bool = False) -> tuple[str, list[list[Parameter] | None], str | None]:
    """For formats that write each argument apart (key, then value): the rules of the functions'
    property values as JSON, each function's properties in their declared order (None where its
    schema lists none: it takes any), and the expression of any JSON value (`any_value`). `own`
    gives a property's expression where the format writes it otherwise than as JSON (else None),
    or raises a SchemaError for a property it cannot take. A SchemaError's path starts with the
    function's place in `functions`."""
    schemas: list[Any] = [{}] if any_value else []
    roots: list[Any] = list(schemas)
    at: list[str] = [""] if any_value else []
    found: list[list[tuple[str, bool, str | int]] | None] = []
    for k, (_, schema) in enumerate(functions):
        props = schema.get("properties") if isinstance(schema, dict) else None
        if not isinstance(props, dict) or not props:
            found.append(None)
            continue
        required = schema.get("required") or []
        items: list[tuple[str, bool, str | int]] = []
        for key, prop in props.items():
            try:
                expr: str | int | None = own(key, prop)
            except SchemaError as e:
                where = f"{k}.properties.{key}"
                raise SchemaError(_join(where, e.path) if e.path else where, e.reason) from None
            if expr is None:
                expr = len(schemas)
                schemas.append(prop)
                roots.append(schema)
                at.append(f"{k}.properties.{key}")
            items.append((key, key in required, expr))
        found.append(items)
    try:
        rules, tops = values_gbnf(schemas, "value", roots)
    except SchemaError as e:
        i, _, rest = e.path.partition(".")
        raise SchemaError(at[int(i)] + (f".{rest}" if rest else ""), e.reason) from None
    calls = [None if items is None else [(key, needed, tops[e] if isinstance(e, int) else e) for key, needed, e in items]
             for items in found]
    return rules, calls, (tops[0] if any_value else None)


def json_object_gbnf() -> str:
    """Any JSON object (response_format json_object)."""
    return schema_to_gbnf({"type": "object"})
