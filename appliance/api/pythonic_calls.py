"""Tool calls in Python's call notation, as LFM2 and LFM2.5 (Liquid AI's edge models) write them:
`<|tool_call_start|>[get_weather(city="Paris", days=3), ...]<|tool_call_end|>`, keyword arguments
whose values are Python literals (JSON's spelling, with True, False and None).

Their templates render only a message's content: a call in the history is written into the
assistant's content in this notation (`written`). The grammar holds each call's arguments to its
function's schema (engine/schema_grammar.py's JSON values, respelled); the answer is read back
with Python's own parser (`ast`, literals only); as it streams, each call is named once its
name is whole and its arguments go out as JSON as they are written (`begun_calls`)."""

from __future__ import annotations

import ast
import json
import re
from typing import Any

from ..engine.schema_grammar import SchemaError, literal, parameters_gbnf
from .call_stream import Begun, compact_json, skip_blanks, value_end

LFM2_OPEN, LFM2_CLOSE = "<|tool_call_start|>", "<|tool_call_end|>"
LFM2_SIGN = "List of tools: "  # how LFM2's templates introduce the tools
_PYTHON = {"true": "True", "false": "False", "null": "None"}
_JSON_WORD = re.compile(r'(?<!\\)"(true|false|null)"')
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_PYTHON_WORD = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|\b(True|False|None)\b|[A-Za-z_][A-Za-z0-9_]*\Z', re.DOTALL)
_JSON = {"True": "true", "False": "false", "None": "null"}


def python_literal(value: Any) -> str:
    """A JSON value written as the Python literal that reads back as it."""
    if value is True or value is False or value is None:
        return {True: "True", False: "False", None: "None"}[value]
    if isinstance(value, (str, int, float)):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        return "[" + ", ".join(python_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k), ensure_ascii=False)}: {python_literal(v)}"
                               for k, v in value.items()) + "}"
    raise TypeError(f"not a JSON value: {type(value).__name__}")


def written(calls: list[tuple[str, Any]]) -> str:
    """Calls (name, arguments) as the model writes them, tags included. Arguments that are not an
    object of identifier keys are passed as `arguments=<the value>`."""
    parts = []
    for name, args in calls:
        if not (isinstance(args, dict) and all(isinstance(k, str) and _KEY.match(k) for k in args)):
            args = {"arguments": args}
        parts.append(f"{name}(" + ", ".join(f"{k}={python_literal(v)}" for k, v in args.items()) + ")")
    return LFM2_OPEN + "[" + ", ".join(parts) + "]" + LFM2_CLOSE


def read(body: str) -> list[tuple[str, dict[str, Any]]]:
    """The calls of `[f(a=1), g()]`: (name, arguments). ValueError, TypeError or SyntaxError
    where it is not a list of calls with keyword arguments of literal values."""
    tree = ast.parse(body.strip(), mode="eval").body
    if not isinstance(tree, ast.List):
        raise ValueError("not a list of calls")
    out = []
    for node in tree.elts:
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
            raise ValueError("not a call with keyword arguments")
        if any(kw.arg is None for kw in node.keywords):
            raise ValueError("** in a call")
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
        json.dumps(args)  # a set or bytes cannot be arguments (TypeError)
        out.append((node.func.id, args))
    return out


def grammar(open_token: int, close_token: int, functions: list[tuple[str, Any]], parallel: bool) -> str:
    """The calls' grammar: `functions` are each callable function's name and parameters schema.
    Its properties come in their declared order, the required ones always, with commas between
    those written; a function whose schema lists no properties takes any keywords. A
    SchemaError's path starts with the function's place in `functions`."""
    rules, params, any_value = parameters_gbnf(functions, _keyword, any_value=True)
    more = ' ("," " "? call)*' if parallel else ""
    lines = [f'root ::= <[{open_token}]> "[" call{more} "]" <[{close_token}]>',
             "call ::= " + " | ".join(f"call-{k}" for k in range(len(functions))),
             'sep ::= "," " "?',
             "any-keywords ::= (any-keyword (sep any-keyword)*)?",
             f'any-keyword ::= [a-zA-Z_] [a-zA-Z0-9_]* "=" {any_value}']
    for k, ((name, _), items) in enumerate(zip(functions, params)):
        if items is None:
            lines.append(f'call-{k} ::= {literal(name + "(")} any-keywords ")"')
            continue
        # from-i: the keywords from the i-th on, the first written without a comma; rest-i: the
        # same after one was written, each with its comma (i = len(items): nothing)
        n = len(items)
        for i, (key, needed, value) in enumerate(items):
            kv = f"{literal(key + '=')} {value}"
            rest = f" rest-{k}-{i + 1}" if i + 1 < n else ""
            skip = (f"from-{k}-{i + 1}" if i + 1 < n else '""')
            lines.append(f"from-{k}-{i} ::= {kv}{rest}" + ("" if needed else f" | {skip}"))
            if i > 0:
                lines.append(f"rest-{k}-{i} ::= " + (f"sep {kv}{rest}" if needed else f"(sep {kv})?{rest}"))
        lines.append(f'call-{k} ::= {literal(name + "(")} from-{k}-0 ")"')
    return python_spelling("\n".join(lines) + "\n" + rules)


def _keyword(key: str, schema: Any) -> None:
    """Every value is JSON (respelled); a key must be a keyword argument's name."""
    if not _KEY.match(key):
        raise SchemaError("", "a keyword argument's name must be a Python identifier")


def python_spelling(gbnf: str) -> str:
    """JSON's true, false and null in a grammar's literals, spelled as Python's."""
    return _JSON_WORD.sub(lambda m: f'"{_PYTHON[m.group(1)]}"', gbnf)


def _json_text(raw: str) -> str:
    """A value written in this notation (JSON with Python's words), or a prefix of one, as compact
    JSON text: the text of a longer prefix extends that of a shorter one (a word not yet whole is
    held back)."""
    def word(m: re.Match) -> str:
        if m.group().startswith('"'):
            return m.group()
        return _JSON[m.group(1)] if m.group(1) else ""  # a name at the end: it may go on

    return compact_json(_PYTHON_WORD.sub(word, raw))


def _keywords(body: str, i: int) -> tuple[str, int | None]:
    """The JSON text of the keyword arguments that start at `i` (after the call's parenthesis),
    as far as they are written (without its closing brace until the call closes), and where the
    call ends (None: not within `body`). ValueError where they are not keyword arguments."""
    parts: list[str] = []
    i = skip_blanks(body, i)
    while i < len(body):
        if body[i] == ")":
            return "{" + ", ".join(parts) + "}", i + 1
        if body[i] == "," and parts:
            i = skip_blanks(body, i + 1)
            continue
        name = _NAME.match(body, i)
        if name is None:
            raise ValueError("not a keyword argument")
        j = skip_blanks(body, name.end())
        if j == len(body):
            break
        if body[j] != "=":
            raise ValueError("not a keyword argument")
        j = skip_blanks(body, j + 1)
        if j == len(body):
            break
        end = value_end(body, j)
        key = json.dumps(name.group(), ensure_ascii=False) + ": "
        if end is None:
            return "{" + ", ".join(parts + [key + _json_text(body[j:])]), None
        parts.append(key + _json_text(body[j:end]))
        i = skip_blanks(body, end)
    return "{" + ", ".join(parts), None


def begun_calls(body: str) -> list[Begun]:
    """The calls written so far in `[f(a=1), g(...` (after the opening tag, cut anywhere): each
    named once its parenthesis opens, its arguments as JSON text as far as they go. ValueError
    where they are not calls."""
    i = skip_blanks(body, 0)
    if i == len(body):
        return []
    if body[i] != "[":
        raise ValueError("not a list of calls")
    out: list[Begun] = []
    i += 1
    while True:
        i = skip_blanks(body, i)
        if i >= len(body) or body[i] == "]":
            return out
        if body[i] == "," and out:
            i += 1
            continue
        name = _NAME.match(body, i)
        if name is None:
            raise ValueError("not a call")
        j = skip_blanks(body, name.end())
        if j == len(body):
            return out
        if body[j] != "(":
            raise ValueError("not a call")
        arguments, end = _keywords(body, j + 1)
        out.append(Begun(name.group(), arguments, end is not None))
        if end is None:
            return out
        i = end
