"""The grammars that hold an answer to a model's own tool-call format (api/native_tools.py says
which formats, api/native_answers.py reads the answers back): each built from the callable
functions' parameter schemas, so that a call's arguments fit its function's schema."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..engine import gemma_notation
from ..engine.schema_grammar import (MAX_REPEAT, checked_format, checked_pattern, format_expression,
                                     literal, never_spelling, parameters_gbnf, values_gbnf)
from ..engine.gbnf_names import renamed_root
from .native_answers import xml_written_as_text
from .native_tools import (CDATA_CLOSE, CDATA_OPEN, DEEPSEEK_TAGS, GLM_KEY, GLM_KEY_CLOSE, GLM_VALUE, GLM_VALUE_CLOSE,
                           HERMES_CLOSE, HERMES_OPEN, JSON_LISTS, MINICPM_FUNCTION, MINICPM_FUNCTION_CLOSE,
                           MINICPM_PARAM, MINICPM_PARAM_CLOSE, MINIMAX_CLOSE, MINIMAX_INVOKE, MINIMAX_INVOKE_CLOSE,
                           MINIMAX_OPEN, MINIMAX_PARAM, MINIMAX_PARAM_CLOSE, SEED_CLOSE, SEED_OPEN, XML_FUNCTION,
                           XML_PARAMETER, NativeFormat)


@dataclass(frozen=True)
class XmlFrame:
    """How the XML-like formats' grammars frame calls, in GBNF: `call_open` and
    `key_open` take a function's name and a parameter's key as GBNF literals."""

    tagged: str  # one call inside its tags (`call` its body)
    between: str  # between two calls
    call_open: Callable[[str], str]
    call_end: str  # after the parameters
    key_open: Callable[[str], str]  # a parameter up to its value
    any_key: str  # the same for a parameter of a function whose schema lists none
    value_end: str  # after a value
    text_end: str  # what a value written as text cannot hold
    cdata: bool = False  # a value written as text may instead be a CDATA block, which holds anything but its end
    one_block: bool = False  # all the calls inside one pair of tags (`calls` in `tagged`), not one pair each


_NL = '"\\n"'
# One piece of a CDATA block's body, which never holds "]]>" (nor "]]]") nor ends in "]"
_CDATA_BODY = '[^\\]] | "]" [^\\]] | "]]" [^\\]>]'
XML_FRAMES = {
    "qwen3-coder": XmlFrame(
        f'"{HERMES_OPEN}" {_NL} call {_NL} "{HERMES_CLOSE}"', _NL, lambda name: literal(f"{XML_FUNCTION}{name}>\n"),
        '"</function>"', lambda key: literal(f"{XML_PARAMETER}{key}>\n"), f'"{XML_PARAMETER}" [a-zA-Z0-9_.-]+ ">\\n"',
        '"\\n</parameter>\\n"', "</parameter>"),
    "glm": XmlFrame(
        f'"{HERMES_OPEN}" call "{HERMES_CLOSE}"', f"{_NL}?", lambda name: f"{literal(name)} {_NL}?", "",
        lambda key: f'{literal(GLM_KEY + key + GLM_KEY_CLOSE)} {_NL}? "{GLM_VALUE}"',
        f'"{GLM_KEY}" [a-zA-Z0-9_.-]+ "{GLM_KEY_CLOSE}" {_NL}? "{GLM_VALUE}"', f'"{GLM_VALUE_CLOSE}" {_NL}?',
        GLM_VALUE_CLOSE),
    "seed-oss": XmlFrame(
        f'{literal(SEED_OPEN)} {_NL} call {_NL} {literal(SEED_CLOSE)}', _NL, lambda name: literal(f"{XML_FUNCTION}{name}>\n"),
        '"</function>"', lambda key: literal(f"{XML_PARAMETER}{key}>"), f'"{XML_PARAMETER}" [a-zA-Z0-9_.-]+ ">"',
        '"</parameter>\\n"', "</parameter>"),
    "minimax": XmlFrame(
        f"{literal(MINIMAX_OPEN)} {_NL} calls {literal(MINIMAX_CLOSE)}", "",
        lambda name: literal(f'{MINIMAX_INVOKE}{name}">\n'), literal(MINIMAX_INVOKE_CLOSE + "\n"),
        lambda key: literal(f'{MINIMAX_PARAM}{key}">'), f'{literal(MINIMAX_PARAM)} [a-zA-Z0-9_.-]+ "\\">"',
        literal(MINIMAX_PARAM_CLOSE + "\n"), MINIMAX_PARAM_CLOSE, one_block=True),
    "minicpm5": XmlFrame(
        "call", f"{_NL}?", lambda name: literal(f'{MINICPM_FUNCTION}{name}">'), literal(MINICPM_FUNCTION_CLOSE),
        lambda key: literal(f'{MINICPM_PARAM}{key}">'), f'{literal(MINICPM_PARAM)} [a-zA-Z0-9_.-]+ "\\">"',
        literal(MINICPM_PARAM_CLOSE), MINICPM_PARAM_CLOSE, cdata=True),
}


def call_schema(fmt: NativeFormat, name: str, parameters: Any) -> dict[str, Any]:
    """The JSON object of one call to `name` in `fmt` (not mistral-args, whose calls are not objects)."""
    if fmt.name == "apertus":  # the name is the object's one key
        return {"type": "object", "properties": {name: parameters}, "required": [name]}
    properties: dict[str, Any] = {fmt.name_key: {"const": name}, fmt.args_key: parameters}
    if fmt.name == "mistral":  # the model may write the id its template showed it in earlier calls
        properties["id"] = {"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}
    if fmt.name == "apriel":  # so may Apriel (its ids are the client's, `call_...` mostly)
        properties["id"] = {"type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$"}
    required = [fmt.name_key, fmt.args_key]
    if fmt.name == "command-r":  # its calls are numbered first, as its template writes them
        properties = {"tool_call_id": {"type": "string", "pattern": "^[0-9]{1,3}$"}, **properties}
        required.insert(0, "tool_call_id")
    return {"type": "object", "properties": properties, "required": required}


def grammar(fmt: NativeFormat, call_gbnf: str, parallel: bool, auto: bool) -> str:
    """The answer's grammar from that of one call's JSON object (start symbol `root`): one call,
    or several when `parallel`, in the format's frame. Under `auto` llama3's answer may instead be
    text that does not begin with `{` (nor with `<|`, where `<|python_tag|>` is a token that may
    open its call); the other formats are free until their lazy trigger."""
    calls = renamed_root(call_gbnf, "call")
    if fmt.name == "hermes":
        more = ' ("\\n" tagged-call)*' if parallel else ""
        return (f"root ::= tagged-call{more}\n"
                f'tagged-call ::= "{HERMES_OPEN}" "\\n"? call "\\n"? "{HERMES_CLOSE}"\n' + calls)
    if fmt.name in JSON_LISTS:
        space = ' "\\n"{0,2} " "{0,8}' if fmt.name == "command-r" else ""  # its template writes the list on lines
        between = space.strip() or '" "?'
        more = f' ("," {between} call)*' if parallel else ""
        close = ""
        if fmt.list_close is not None:
            close = f" <[{fmt.close_token}]>" if fmt.close_token is not None else f" {literal(fmt.list_close)}"
        opener = f"<[{fmt.open_token}]>" if fmt.open_token is not None else literal(fmt.marker)
        return f'root ::= {opener} "["{space} call{more}{space} "]"{close}\n' + calls
    if fmt.name == "gigachat":
        return f"root ::= <[{fmt.open_token}]> call\n" + calls
    if fmt.name == "llama3":
        tag, free = "", ' | ([^{] [^\\x00]*)?'
        if fmt.tag_tokens:  # the call may follow <|python_tag|>; text may not begin as that token's text
            tag, free = f"<[{fmt.tag_tokens[0]}]>? ", ' | ([^{<] [^\\x00]* | "<" ([^|] [^\\x00]*)?)?'
        return f"root ::= {tag}call{free if auto else ''}\n" + calls
    raise ValueError(f"{fmt.name} calls are not JSON objects: args_grammar or xml_grammar")


def args_grammar(fmt: NativeFormat, functions: list[tuple[str, Any]], parallel: bool) -> str:
    """mistral-args' grammar: `functions` are each callable function's name and parameters
    schema. A SchemaError's path starts with the function's place in `functions`."""
    rules, tops = values_gbnf([schema for _, schema in functions], "args")
    call_id = f"(<[{fmt.call_id_token}]> [a-zA-Z0-9]{{9}})? " if fmt.call_id_token is not None else ""
    alternatives = " | ".join(f"{literal(name)} args-sep {args}" for (name, _), args in zip(functions, tops))
    return (f"root ::= call{'+' if parallel else ''}\n"
            f"call ::= <[{fmt.open_token}]> ({alternatives})\n"
            f"args-sep ::= {call_id}<[{fmt.args_token}]>\n" + rules)


def kimi_grammar(fmt: NativeFormat, functions: list[tuple[str, Any]], parallel: bool) -> str:
    """Kimi K2's grammar: `functions` are each callable function's name and parameters schema;
    each call is numbered in its id (`functions.name:0`), as its template numbers them."""
    rules, tops = values_gbnf([schema for _, schema in functions], "args")
    call, call_end = fmt.tag_tokens
    alternatives = " | ".join(f'{literal(name)} ":" [0-9]{{1,4}} <[{fmt.args_token}]> {args}'
                              for (name, _), args in zip(functions, tops))
    return (f"root ::= <[{fmt.open_token}]> call{'+' if parallel else ''} <[{fmt.close_token}]>\n"
            f'call ::= <[{call}]> "functions." ({alternatives}) <[{call_end}]>\n' + rules)


def deepseek_grammar(fmt: NativeFormat, functions: list[tuple[str, Any]], parallel: bool) -> str:
    """DeepSeek R1's grammar: `functions` are each callable function's name and parameters
    schema; each call's arguments a JSON block fenced as its template writes it."""
    rules, tops = values_gbnf([schema for _, schema in functions], "args")
    calls, calls_end, call, sep, call_end = (literal(tag) for tag in DEEPSEEK_TAGS)
    alternatives = " | ".join(f'{literal(name)} "\\n```json\\n" {args} "\\n```"' for (name, _), args in zip(functions, tops))
    more = ' ("\\n" call)*' if parallel else ""
    return (f"root ::= {calls} call{more} {calls_end}\n"
            f'call ::= {call} "function" {sep} ({alternatives}) {call_end}\n' + rules)


def harmony_grammar(fmt: NativeFormat, auto: bool, think_budget: int, functions: list[tuple[str, Any]],
                    parallel: bool) -> str:
    """gpt-oss's grammar, over the whole answer: its analysis channel (any tokens but its end, at
    most `think_budget` of them where it is 0..2000), then the call in its commentary channel or,
    under `auto`, the final channel's answer. `functions` are each callable function's name and
    parameters schema; one call a message."""
    channel, message, start, end, constrain = (f"<[{t}]>" for t in fmt.tag_tokens)
    bound = f"{{0,{think_budget}}}" if 0 <= think_budget <= MAX_REPEAT else "*"
    rules, tops = values_gbnf([schema for _, schema in functions], "args")
    calls = " | ".join(f'{literal(name)} " " {constrain} "json" {message} {args}'
                       for (name, _), args in zip(functions, tops))
    answer = f" | {channel} \"final\" {message} !{end}*" if auto else ""
    return (f"root ::= analysis? (call{answer})\n"
            f'analysis ::= {channel} "analysis" {message} !{end}{bound} {end} {start} "assistant"\n'
            f'call ::= {channel} "commentary to=functions." ({calls})\n' + rules)


def _xml_text(schema: Any, cdata: bool) -> str | None:
    """The grammar of a qwen3-coder parameter written as raw text (a string's), None for one
    written as JSON. A string's minLength/maxLength bound its pieces (a piece is one character,
    or a prefix of the end tag and the character that leaves it), except in a CDATA frame."""
    if not xml_written_as_text(schema):
        return None
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    if values:
        return "(" + " | ".join(literal(v) for v in values) + ")"
    shaped = _xml_shaped_text(schema)
    if shaped is not None:
        return shaped
    lo, hi = schema.get("minLength", 0), schema.get("maxLength")
    lo = lo if type(lo) is int and 0 <= lo <= MAX_REPEAT else 0
    hi = hi if type(hi) is int and lo <= hi <= MAX_REPEAT else None
    if cdata or (lo == 0 and hi is None):
        return "xml-text"
    return f"xml-char{{{lo},{'' if hi is None else hi}}}"


def _xml_shaped_text(schema: dict) -> str | None:
    """A raw-text string's `pattern` or `format` (date, time, date-time, uuid) as a grammar,
    checked as structured output checks a JSON string's (None: it has neither)."""
    if "pattern" in schema:
        expr, any_start, any_end = checked_pattern(schema, "", raw=True)
        return "(" + " ".join([*(["xml-char*"] if any_start else []), expr, *(["xml-char*"] if any_end else [])]) + ")"
    fmt = checked_format(schema, "")
    return format_expression(fmt) if fmt is not None else None


def xml_grammar(fmt: NativeFormat, functions: list[tuple[str, Any]], parallel: bool) -> str:
    """The XML-like formats' grammar (XML_FRAMES): `functions` are each callable function's name and
    parameters schema. Its properties come in their declared order, the required ones always; a
    function whose schema lists no properties takes any. A SchemaError's path starts with the
    function's place in `functions`."""
    frame = XML_FRAMES[fmt.name]
    rules, params, _ = parameters_gbnf(functions, lambda _, schema: _xml_text(schema, frame.cdata))
    calls = [(name, items) for (name, _), items in zip(functions, params)]
    more = f" ({frame.between} tagged-call)*" if parallel and not frame.one_block else ""
    lines = [f"root ::= tagged-call{more}", f"tagged-call ::= {frame.tagged}",
             "call ::= " + " | ".join(f"call-{k}" for k in range(len(calls)))]
    if frame.one_block:
        lines.append(f"calls ::= call{'+' if parallel else ''}")
    for k, (name, items) in enumerate(calls):
        if items is None:
            body = "xml-any-parameter*"
        else:
            parts = []
            for param, needed, value in items:
                part = f"{frame.key_open(param)} {value} {frame.value_end}"
                parts.append(part if needed else f"({part})?")
            body = " ".join(parts)
        lines.append(f"call-{k} ::= {frame.call_open(name)} {body} {frame.call_end}".rstrip())
    lines.append(f"xml-any-parameter ::= {frame.any_key} xml-text {frame.value_end}")
    text = f"({never_spelling(frame.text_end)})*"
    if frame.cdata:  # text that begins with `<` is a CDATA block, as the template writes it
        text = f"{literal(CDATA_OPEN)} ({_CDATA_BODY})* {literal(CDATA_CLOSE)} | ([^<] {text})?"
        lines.append("xml-char ::= [^<&\\n]")  # a pattern's free ends: what the template writes bare
    else:
        lines.append(f"xml-char ::= {never_spelling(frame.text_end)}")
        text = "xml-char*"
    lines.append(f"xml-text ::= {text}")
    return "\n".join(lines) + "\n" + rules


def gemma_grammar(fmt: NativeFormat, functions: list[tuple[str, Any]], parallel: bool) -> str:
    """gemma4's and functiongemma's grammar: `functions` are each callable function's name and
    parameters schema, whose arguments are held to it in Gemma's notation. A SchemaError's path starts with the
    function's place in `functions`."""
    mark = fmt.tags.mark
    quote = f"<[{fmt.quote_token}]>" if fmt.quote_token is not None else literal(mark)
    rules, tops = gemma_notation.schemas_gbnf([schema for _, schema in functions], "args", quote, mark)
    alternatives = " | ".join(f"{literal(name)} {args}" for (name, _), args in zip(functions, tops))
    return (f"root ::= call{'+' if parallel else ''}\n"
            f'call ::= <[{fmt.open_token}]> "call:" ({alternatives}) <[{fmt.close_token}]>\n' + rules)
