"""Answers in a model's own tool-call format (api/native_tools.py says which formats) read back
into calls: whole (`read_answer`), or as they stream (`AnswerReader`: the calls begun so far,
`begun_calls`, go out as they are written, api/call_stream.py)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from typing import Any

from ..engine import gemma_notation
from ..engine.text import partial_suffix
from . import pythonic_calls
from .call_stream import (READ_ERRORS, Begun, CallReader, compact_json, elements, json_call, keyed_call, skip_blanks,
                          tool_calls, value_end)
from .native_tools import (CDATA_CLOSE, CDATA_OPEN, DEEPSEEK_CALL, DEEPSEEK_CALL_END, DEEPSEEK_CALLS,
                           DEEPSEEK_CALLS_END, DEEPSEEK_SEP, GLM_VALUE_CLOSE, HARMONY_CALL, HERMES_CLOSE, HERMES_OPEN,
                           JSON_LISTS, KIMI_ARGS, KIMI_CALL, KIMI_CALL_END, KIMI_SECTION, KIMI_SECTION_END, LFM2_CLOSE,
                           LFM2_OPEN, LLAMA3_PYTHON_TAG, MINICPM_FUNCTION, MINICPM_FUNCTION_CLOSE, MINICPM_PARAM_CLOSE,
                           MINIMAX_CLOSE, MINIMAX_INVOKE, MINIMAX_INVOKE_CLOSE, MINIMAX_OPEN, MINIMAX_PARAM_CLOSE,
                           MISTRAL_ARGS, MISTRAL_CALL_ID, MISTRAL_ID, MISTRAL_OPEN, SEED_CLOSE, SEED_OPEN, XML_FUNCTION,
                           NativeFormat)
from .schemas import ToolCall

_HARMONY_HEAD = re.compile(r"([^\s<]+)\s*(?:<\|constrain\|>)?\s*json\s*<\|message\|>")


def xml_written_as_text(schema: Any) -> bool:
    """Whether a qwen3-coder parameter of this schema is written as raw text (a string), not JSON."""
    if not isinstance(schema, dict):
        return False
    if "const" in schema or "enum" in schema:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        return isinstance(values, list) and bool(values) and all(isinstance(v, str) for v in values)
    return schema.get("type") == "string"


def _xml_value(raw: str, schema: Any) -> Any:
    """A qwen3-coder parameter's value: a string's raw text as it is, else the JSON it holds (or
    Python's spelling of true, false and null, as the template writes them), else the text."""
    if xml_written_as_text(schema):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return {"True": True, "False": False, "None": None}.get(raw.strip(), raw)


def _parameters_of(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Each function's parameter schemas by name, from tools as templates take them."""
    out = {}
    for tool in tools or []:
        props = tool["function"].get("parameters", {}).get("properties")
        out[tool["function"]["name"]] = props if isinstance(props, dict) else {}
    return out


def _model_id(fmt: NativeFormat, call_id: Any) -> str | None:
    """The id a Mistral model wrote for its call, where it is one its templates take."""
    ok = isinstance(call_id, str) and MISTRAL_ID.match(call_id) and fmt.name.startswith("mistral")
    return call_id if ok else None


def _closed_by(rest: str, close: str) -> bool:
    """Whether `rest` (what follows a call's body) is its closing tag; ValueError where it cannot
    become one."""
    rest = rest.strip()
    if rest == close:
        return True
    if rest and not close.startswith(rest):
        raise ValueError("text after a call")
    return False


def _hermes(text: str) -> list[Begun]:
    out = []
    for block in text.split(HERMES_OPEN)[1:]:
        i = skip_blanks(block, 0)
        if i == len(block):
            break
        call, end = json_call(block, i)
        if call is None:
            break
        if end is not None and not _closed_by(block[end:], HERMES_CLOSE):
            call = replace(call, whole=False)
        out.append(call)
        if not call.whole:
            break
    return out


@dataclass(frozen=True)
class XmlShape:
    """How a format writes a call's name and parameters between its tags, a string parameter's
    value as its raw text and other values as JSON."""

    head: re.Pattern  # the call's body up to its name, once the name is whole (group 1)
    head_start: str  # what the body opens with before the name
    call: re.Pattern  # a whole call's body (group 1: the name, group 2: its parameters)
    parameter: re.Pattern  # a closed parameter (group 1: its key, group 2: its value)
    opened: re.Pattern  # a parameter up to where its value starts
    value_ends: tuple[str, ...]  # what may close a value (a tail that may be one is held back)
    framed_newline: bool  # a value's first newline is the frame's, not the value's
    open: str = HERMES_OPEN  # what opens a call
    close: str = HERMES_CLOSE  # what closes it
    cdata: bool = False  # a value may be a CDATA block (MiniCPM 5's), which may hold the tags
    block: tuple[str, str] | None = None  # the tags around all the calls (MiniMax's), where one pair holds them


XML_SHAPES = {
    "qwen3-coder": XmlShape(re.compile(r"\s*<function=([^>\n]+)>"), XML_FUNCTION,
                            re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL),
                            re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL),
                            re.compile(r"<parameter=([^>\n]+)>"), ("\n</parameter>", "</parameter>"), True),
    "glm": XmlShape(re.compile(r"\s*([^<\n]+)(?=[\n<])"), "",
                    re.compile(r"([^<\n]+?)\s*((?:<arg_key>.*?</arg_value>\s*)*)", re.DOTALL),
                    re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL),
                    re.compile(r"<arg_key>([^<]*)</arg_key>\s*<arg_value>"), (GLM_VALUE_CLOSE,), False),
    "seed-oss": XmlShape(re.compile(r"\s*<function=([^>\n]+)>"), XML_FUNCTION,
                         re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL),
                         re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL),
                         re.compile(r"<parameter=([^>\n]+)>"), ("</parameter>",), False, SEED_OPEN, SEED_CLOSE),
    "minimax": XmlShape(re.compile(r'([^"<>\n]+)">'), "",
                        re.compile(r'([^"<>\n]+)">\s*((?:<parameter name="[^"<>\n]+">.*?</parameter>\s*)*)', re.DOTALL),
                        re.compile(r'<parameter name="([^"<>\n]+)">(.*?)</parameter>', re.DOTALL),
                        re.compile(r'<parameter name="([^"<>\n]+)">'), (MINIMAX_PARAM_CLOSE,), False,
                        MINIMAX_INVOKE, MINIMAX_INVOKE_CLOSE, block=(MINIMAX_OPEN, MINIMAX_CLOSE)),
    "minicpm5": XmlShape(re.compile(r'([^"<>\n]+)">'), "",
                         re.compile(r'([^"<>\n]+)">\s*((?:<param name="[^"<>\n]+">.*?</param>\s*)*)', re.DOTALL),
                         re.compile(r'<param name="([^"<>\n]+)">(.*?)</param>', re.DOTALL),
                         re.compile(r'<param name="([^"<>\n]+)">'), (MINICPM_PARAM_CLOSE,), False,
                         MINICPM_FUNCTION, MINICPM_FUNCTION_CLOSE, cdata=True),
}
_CDATA = re.compile(r"<!\[CDATA\[.*?(?:\]\]>|\Z)", re.DOTALL)


def _cdata_hidden(text: str) -> str:
    """`text` with each CDATA block's characters (an open one's to the end) blanked out, at the
    same places: the tags are found in it, the values read from `text`."""
    return _CDATA.sub(lambda m: "\x00" * len(m.group()), text)


def _unwrapped(raw: str) -> str:
    """A value's text out of its CDATA block, where it is one."""
    if raw.startswith(CDATA_OPEN) and raw.endswith(CDATA_CLOSE):
        return raw[len(CDATA_OPEN):-len(CDATA_CLOSE)]
    return raw


def _xml_calls(shape: XmlShape, text: str, tools: list[dict[str, Any]] | None) -> list[Begun]:
    """Calls in an XML-like format (qwen3-coder's, GLM's, MiniCPM 5's, ...): each named once its
    name is whole, its arguments as they are written (_xml_arguments_so_far), whole when its tag
    closes. The tags are looked for outside CDATA blocks; where one block holds the calls, inside it."""
    if shape.block is not None:
        text = _block_body(text, *shape.block)
    schemas = _parameters_of(tools)
    view = _cdata_hidden(text) if shape.cdata else text
    starts = [m.end() for m in re.finditer(re.escape(shape.open), view)]
    out = []
    for k, start in enumerate(starts):
        end = starts[k + 1] - len(shape.open) if k + 1 < len(starts) else len(text)
        block, seen = text[start:end], view[start:end]
        head = shape.head.match(seen)
        if head is None:
            begun = block.lstrip()
            if not (shape.head_start.startswith(begun[:len(shape.head_start)]) and ">" not in begun
                    and (shape.head_start or "<" not in begun)):
                raise ValueError("not a function block")
            break
        name = head.group(1).strip()
        props = schemas.get(name, {})
        cut = seen.find(shape.close)
        if cut < 0:
            out.append(Begun(name, _xml_arguments_so_far(shape, block[head.end():], seen[head.end():], props), False))
            break
        body, rest = seen[:cut].strip(), seen[cut + len(shape.close):]
        call = shape.call.fullmatch(body)
        if call is None or rest.strip():
            raise ValueError("not a function block")
        offset = cut - len(seen[:cut].lstrip())
        args = {}
        for m in shape.parameter.finditer(body, call.start(2), call.end(2)):
            key = m.group(1).strip()
            args[key] = _xml_value(_read_value(shape, block[offset + m.start(2):offset + m.end(2)]), props.get(key))
        out.append(Begun(name, json.dumps(args, ensure_ascii=False), True))
    return out


def _block_body(text: str, open_: str, close: str) -> str:
    """What is inside the one block of calls `text` opens with, up to its closing tag (or as much
    of that tag as has come); nothing may follow the tag."""
    body = text.removeprefix(open_)
    end = body.find(close)
    if end < 0:
        return body[:len(body) - partial_suffix(body, [close])]
    if body[end + len(close):].strip():
        raise ValueError("text after the calls")
    return body[:end]


def _read_value(shape: XmlShape, raw: str) -> str:
    return _unwrapped(raw) if shape.cdata else raw


def _xml_arguments_so_far(shape: XmlShape, body: str, seen: str, props: dict[str, Any]) -> str:
    """The JSON text of an open call's arguments so far (`seen`: its body as the tags are looked
    for in it): its parameters closed so far, and a string parameter being written up to where
    its text is sure (not the newline before a closing tag, nor what may be the tag's beginning,
    nor a CDATA block's end). It never has its closing brace: it is a prefix of the whole call's
    arguments, which are json.dumps of the same values."""
    parts, last = [], 0
    for m in shape.parameter.finditer(seen):
        key = m.group(1).strip()
        value = _read_value(shape, body[m.start(2):m.end(2)])
        parts.append(json.dumps(key, ensure_ascii=False) + ": "
                     + json.dumps(_xml_value(value, props.get(key)), ensure_ascii=False))
        last = m.end()
    open_param = shape.opened.search(seen, last)
    text = "{" + ", ".join(parts)
    if open_param is None or not xml_written_as_text(props.get(open_param.group(1).strip())):
        return text
    raw = body[open_param.end():]
    if shape.cdata and CDATA_OPEN.startswith(raw[:len(CDATA_OPEN)]):
        if len(raw) < len(CDATA_OPEN):  # a CDATA block or text: not known yet
            return text
        raw = raw[len(CDATA_OPEN):]
        raw = raw[:len(raw) - partial_suffix(raw, [CDATA_CLOSE])].split(CDATA_CLOSE)[0]
    else:
        if not raw:
            return text
        if shape.framed_newline and raw.startswith("\n"):
            raw = raw[1:]
        raw = raw[:len(raw) - partial_suffix(raw, list(shape.value_ends))]
    if parts:
        text += ", "
    key = json.dumps(open_param.group(1).strip(), ensure_ascii=False)
    return text + key + ": " + json.dumps(raw, ensure_ascii=False)[:-1]


def _json_list(fmt: NativeFormat, text: str) -> list[Begun]:
    """Calls in a JSON list after the format's marker (Mistral's, Granite's; Nemotron's, Command R's
    and Apertus', which close it with their tag). Mistral's each go out once whole: the id the model may
    write comes after the arguments."""
    i = skip_blanks(text, len(fmt.marker))
    if i == len(text):
        return []
    found, end = elements(text, i)
    out = []
    for start, stop in found:
        if stop is None and fmt.name == "mistral":
            break
        call, _ = keyed_call(text, start) if fmt.name == "apertus" else json_call(text, start, (fmt.args_key,),
                                                                                 fmt.name_key)
        if call is None:
            break
        out.append(replace(call, call_id=_model_id(fmt, call.call_id)))
    rest = text[end:].strip() if end is not None else ""
    if rest and not (fmt.list_close is not None and fmt.list_close.startswith(rest)):
        raise ValueError("text after the calls")
    return out


def _json_arguments(args: str) -> tuple[str, bool]:
    """A call's arguments written as a JSON object after its header, to the end of `args` (cut
    anywhere): their compact text so far, and whether the object is whole. ValueError where a
    whole one is not an object or text follows it."""
    i = skip_blanks(args, 0)
    end = value_end(args, i)
    if end is not None and (args[end:].strip() or not isinstance(json.loads(args[i:end]), dict)):
        raise ValueError("not a call's arguments")
    return compact_json(args[i:end]), end is not None


def _mistral_args(fmt: NativeFormat, text: str) -> list[Begun]:
    out = []
    for block in text.split(MISTRAL_OPEN)[1:]:
        head, sep, args = block.partition(MISTRAL_ARGS)
        if not sep:
            break
        name, _, call_id = head.partition(MISTRAL_CALL_ID)
        out.append(Begun(name.strip(), *_json_arguments(args), _model_id(fmt, call_id or None)))
    return out


_KIMI_HEAD = re.compile(r"\s*functions\.([^:\s<]+):(\d+)\s*" + re.escape(KIMI_ARGS))


def _kimi(text: str) -> list[Begun]:
    """Kimi K2's calls: each named once its id (`functions.name:0`, which is its call id) is whole,
    its arguments as they come."""
    body, _, rest = text[len(KIMI_SECTION):].partition(KIMI_SECTION_END)
    if rest.strip():
        raise ValueError("text after the calls")
    blocks = body.split(KIMI_CALL)
    if blocks[0].strip():
        raise ValueError("not a call")
    out = []
    for block in blocks[1:]:
        head = _KIMI_HEAD.match(block)
        if head is None:
            if KIMI_ARGS in block:
                raise ValueError("not a call's id")
            break
        args, end, after = block[head.end():].partition(KIMI_CALL_END)
        if end and after.strip():
            raise ValueError("text between calls")
        arguments, whole = _json_arguments(args)
        call_id = f"functions.{head.group(1)}:{head.group(2)}"
        out.append(Begun(head.group(1), arguments, whole and bool(end), call_id))
    return out


def _deepseek(text: str) -> list[Begun]:
    """DeepSeek R1's calls: each named once its name's line is whole, its arguments as they come
    (a JSON object fenced in ```json ... ```)."""
    body, _, rest = text[len(DEEPSEEK_CALLS):].partition(DEEPSEEK_CALLS_END)
    if rest.strip():
        raise ValueError("text after the calls")
    blocks = body.split(DEEPSEEK_CALL)
    if blocks[0].strip():
        if len(blocks) > 1 or not DEEPSEEK_CALL.startswith(blocks[0].strip()):  # (the tag written so far)
            raise ValueError("not a call")
        return []
    out = []
    for block in blocks[1:]:
        kind, sep, named = block.partition(DEEPSEEK_SEP)
        if not sep:
            if not ("function" + DEEPSEEK_SEP).startswith(kind.strip()):
                raise ValueError("not a function call")
            break
        name, newline, fenced = named.partition("\n")
        if not newline:
            break
        opening = "```json\n"
        if not fenced.startswith(opening):
            if not opening.startswith(fenced):
                raise ValueError("not a fenced call")
            out.append(Begun(name.strip(), "", False))
            break
        args = fenced[len(opening):]
        i = skip_blanks(args, 0)
        end = value_end(args, i) if i < len(args) else None
        if end is None:
            out.append(Begun(name.strip(), compact_json(args[i:]), False))
            break
        closing, fence = args[end:].lstrip(), "```" + DEEPSEEK_CALL_END
        whole = closing.startswith(fence)
        after = closing[len(fence):].strip() if whole else ""  # the next tag, as far as it is written
        if (not whole and not fence.startswith(closing)) or (
                after and not (DEEPSEEK_CALL.startswith(after) or DEEPSEEK_CALLS_END.startswith(after))):
            raise ValueError("text after a call's arguments")
        if not isinstance(json.loads(args[i:end]), dict):
            raise ValueError("a call's arguments are not an object")
        out.append(Begun(name.strip(), compact_json(args[i:end]), whole))
    return out


def _gemma(fmt: NativeFormat, text: str) -> list[Begun]:
    tags = fmt.tags
    out = []
    for block in text.split(tags.open)[1:]:
        body, close, rest = block.partition(tags.close)
        if "{" not in body:
            if not (body.startswith("call:") or "call:".startswith(body)) or close:
                raise ValueError("not a call")
            break
        if not body.startswith("call:"):
            raise ValueError("not a call")
        name, brace, args = body[len("call:"):].partition("{")
        if not close:
            out.append(Begun(name, "", False))
            break
        if rest.strip():
            raise ValueError("text after a call")
        out.append(Begun(name, json.dumps(gemma_notation.read(brace + args, tags.mark), ensure_ascii=False), True))
    return out


def _lfm2(text: str) -> list[Begun]:
    """LFM2's calls: each named once its parenthesis opens, its arguments as JSON as they are
    written (pythonic_calls.begun_calls); once the list closes, the calls Python's parser reads
    (literals only), their arguments as streamed where they are the same values."""
    body, close, rest = text[len(LFM2_OPEN):].partition(LFM2_CLOSE)
    begun = pythonic_calls.begun_calls(body)
    if not close:
        return begun
    if rest.strip():
        raise ValueError("text after the calls")
    read = pythonic_calls.read(body)
    out = []
    for k, (name, args) in enumerate(read):
        streamed = begun[k].arguments if k < len(begun) and begun[k].whole else None
        same = streamed is not None and begun[k].name == name and json.loads(streamed) == args
        out.append(Begun(name, streamed if same else json.dumps(args, ensure_ascii=False), True))
    return out


def _harmony(text: str) -> list[Begun]:
    """gpt-oss's call: `<|channel|>commentary to=functions.name <|constrain|>json<|message|>{...}`
    (generation ends at its `<|call|>`), named once its header is whole."""
    rest = text[len(HARMONY_CALL):]
    head = _HARMONY_HEAD.match(rest)
    if head is None:
        name = re.match(r"[^\s<]+(?=[\s<])", rest)
        return [Begun(name.group(), "", False)] if name else []
    return [Begun(head.group(1), *_json_arguments(rest[head.end():].removesuffix("<|call|>")))]


def begun_calls(fmt: NativeFormat, text: str, tools: list[dict[str, Any]] | None = None) -> list[Begun]:
    """The calls written so far in `text`, from the format's marker on, cut anywhere (`tools`: the
    request's, as templates take them, which say how qwen3-coder's values read). ValueError (or
    KeyError, TypeError) where they do not read."""
    if fmt.name == "hermes":
        return _hermes(text)
    if fmt.name in XML_SHAPES:
        return _xml_calls(XML_SHAPES[fmt.name], text, tools)
    if fmt.name in JSON_LISTS:
        return _json_list(fmt, text)
    if fmt.name == "mistral-args":
        return _mistral_args(fmt, text)
    if fmt.tags is not None:
        return _gemma(fmt, text)
    if fmt.name == "lfm2":
        return _lfm2(text)
    if fmt.name == "harmony":
        return _harmony(text)
    if fmt.name == "kimi-k2":
        return _kimi(text)
    if fmt.name == "deepseek-r1":
        return _deepseek(text)
    # llama3: the answer is the call, after <|python_tag|> or not; gigachat: the call follows its tag
    skip = len(fmt.marker) if fmt.marker else len(LLAMA3_PYTHON_TAG) if text.startswith(LLAMA3_PYTHON_TAG) else 0
    i = skip_blanks(text, skip)
    if i == len(text):
        return []
    call, end = json_call(text, i, (fmt.args_key, "arguments"))
    if end is not None and text[end:].strip():
        raise ValueError("text after the call")
    return [call] if call is not None else []


def _calls_start(fmt: NativeFormat, text: str) -> int:
    """Where the calls begin in an answer (-1: it has none)."""
    if fmt.marker is not None:
        return text.find(fmt.marker)
    stripped = text.lstrip()
    return len(text) - len(stripped) if stripped.startswith(("{", LLAMA3_PYTHON_TAG)) else -1


def _may_open_llama3_call(text: str) -> bool:
    """Whether a Llama 3.x answer, so far, is or may become a call (its first character, or its
    python tag, or the start of that tag)."""
    stripped = text.lstrip()
    return not stripped or stripped.startswith(("{", LLAMA3_PYTHON_TAG)) or LLAMA3_PYTHON_TAG.startswith(stripped)


def _whole_calls(fmt: NativeFormat, text: str, finish_reason: str,
                 tools: list[dict[str, Any]] | None) -> tuple[int, list[Begun] | None]:
    """Where an answer's calls begin, and the calls, where they read whole (None: they do not, or
    the answer was cut short)."""
    start = _calls_start(fmt, text)
    if start < 0 or finish_reason != "stop":
        return start, None
    try:
        begun = begun_calls(fmt, text[start:].rstrip(), tools)
    except READ_ERRORS:
        return start, None
    return start, (begun if begun and all(c.whole for c in begun) else None)


def read_answer(fmt: NativeFormat, text: str, finish_reason: str,
                tools: list[dict[str, Any]] | None = None) -> tuple[str | None, list[ToolCall] | None, str]:
    """(content, tool_calls, finish_reason) from an answer in the model's format (`tools`: the
    request's, as templates take them, which say how qwen3-coder's values read). Text before the
    calls is the content; an answer cut short (max_tokens, a stop string) inside its calls, or
    whose calls do not read, is its text as it is."""
    start, whole = _whole_calls(fmt, text, finish_reason, tools)
    if whole is None:
        return text, None, finish_reason
    return text[:start].rstrip() or None, tool_calls(whole, fmt.new_id), "tool_calls"


class AnswerReader(CallReader):
    """Reads an answer in the model's format as it streams: text before the calls goes out as it
    comes (a tail that may be the marker's beginning waits for the next piece; a llama3 answer
    that begins with `{` or `<|python_tag|>` is a call); the calls go out as they are written (`stream_calls`,
    call_stream.CallReader) or whole at the end."""

    def __init__(self, fmt: NativeFormat, tools: list[dict[str, Any]] | None = None,
                 stream_calls: bool = False) -> None:
        super().__init__(fmt.new_id, stream_calls)
        self.fmt = fmt
        self.tools = tools
        self.text = ""
        self.sent = 0

    def push(self, piece: str) -> str:
        self.text += piece
        marker = self.fmt.marker
        start = _calls_start(self.fmt, self.text)
        if marker is None:
            end = 0 if _may_open_llama3_call(self.text) else len(self.text)
        else:
            end = start if start >= 0 else len(self.text) - partial_suffix(self.text, [marker])
            end = len(self.text[:end].rstrip())  # blanks before a call are not content
        new = self.text[self.sent:end] if end > self.sent else ""
        self.sent += len(new)
        if start >= 0:
            self.follow(lambda: begun_calls(self.fmt, self.text[start:], self.tools), len(self.text) - start)
        return new

    def finish(self, finish_reason: str) -> tuple[str | None, list[ToolCall] | None, str]:
        start, whole = _whole_calls(self.fmt, self.text, finish_reason, self.tools)
        if whole is not None:
            return self.text[:start].rstrip()[self.sent:] or None, self.settle(whole), "tool_calls"
        if self.sent_calls is not None:
            return None, self.sent_calls, finish_reason
        return self.text[self.sent:], None, finish_reason
