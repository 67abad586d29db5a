"""Tool calls in a model's own format, where its chat template has one this server reads.

The template lists the tools itself (its `tools` variable) and renders calls and results; the
answer is held by a grammar to the format and read back into OpenAI's `tool_calls`. The formats:

- hermes: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, one block a call, after
  text of its own or none (Qwen 2.5 and 3, Hermes 2 Pro and 3, many fine-tunes of them), with
  `<tool_call>` one token of the vocabulary;
- mistral: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]` (Mistral 7B v0.3, Nemo,
  Ministral 8B), `[TOOL_CALLS]` a control token;
- mistral-args: `[TOOL_CALLS]name[ARGS]{...}` for each call (Devstral, Magistral, Ministral 3;
  Mistral Small 3.2 may put `[CALL_ID]id` before `[ARGS]`), all three control tokens;
- qwen3-coder: `<tool_call>\n<function=name>\n<parameter=p>\nvalue\n</parameter>\n...</function>\n</tool_call>`,
  a string parameter's value as raw text, others as JSON (Qwen3-Coder, Qwen3.5, Nemotron 3 Nano);
- glm: `<tool_call>name<arg_key>p</arg_key><arg_value>value</arg_value>...</tool_call>`, with or
  without a newline after the name and each tag (GLM 4.5 to 4.7, Ling 3, Laguna, Spark 2.5), values
  as qwen3-coder's; its tags are written out where they are tokens;
- gemma4: `<|tool_call>call:name{key:value,...}<tool_call|>` for each call, in Gemma's own
  notation (engine/gemma_notation.py: strings between `<|"|>` marks, bare keys in sorted order),
  the tags tokens of their own (the mark may be text); functiongemma (FunctionGemma, Gemma 3
  270M tuned for calls): the same notation between `<start_function_call>` and
  `<end_function_call>`, strings between `<escape>` marks;
- lfm2: `<|tool_call_start|>[name(key=value, ...), ...]<|tool_call_end|>`, Python's keyword calls
  of literal values (LFM2, LFM2.5; api/pythonic_calls.py), whose templates render only content:
  calls in the history are written into the assistant's content;
- harmony: gpt-oss's `<|channel|>commentary to=functions.name <|constrain|>json<|message|>{...}`
  after its analysis channel (the reasoning, engine/reasoning.py), one call a message; its grammar
  holds the whole answer (analysis, then the call or, under `auto`, the final channel);
- llama3: the whole answer is one call, `{"name": ..., "parameters": {...}}` (Llama 3.1, 3.2 and
  3.3, whose templates ask for exactly that).

A template with `<tool_call>` tags around another body (MiniMax's `<invoke>`, ...) has no
format here.

Where the format opens with a token, that token starts the grammar (api/native_grammars.py): under `auto` the answer is
free until the model picks it (a lazy grammar, engine/grammar.py), under `required` or a named
function the answer begins with it. Control tokens are written out in the answer's text
(SamplingParams.shown_tokens) so that it can be read back. Llama 3.x has no such token: under
`auto` its grammar lets the answer be a call or text that does not begin with `{`. Mistral's
templates want call ids of 9 letters and digits: the calls this server reads get such ids, and
other ids in the history are mapped to such ids (the same id always to the same one). A template
that names a tag its vocabulary does not have as one token is served in EIE's own format
(api/tools.py).
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import string
import uuid
from dataclasses import dataclass, replace
from typing import Any

from ..engine import gemma_notation
from ..engine.chat_template import ChatTemplate
from ..engine.native import Vocab
from ..engine.text import partial_suffix
from . import pythonic_calls
from .call_stream import READ_ERRORS, Begun, CallReader, compact_json, elements, json_call, skip_blanks, tool_calls, value_end
from .schemas import ChatMessage, ChatRequest, ToolCall

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
LFM2_OPEN, LFM2_CLOSE, LFM2_SIGN = pythonic_calls.LFM2_OPEN, pythonic_calls.LFM2_CLOSE, pythonic_calls.LFM2_SIGN
# gpt-oss's harmony tokens (channel, message, start, end, constrain) and how its calls begin
HARMONY_TAGS = ("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>")
HARMONY_CALL = "<|channel|>commentary to=functions."
_HARMONY_HEAD = re.compile(r"([^\s<]+)\s*(?:<\|constrain\|>)?\s*json\s*<\|message\|>")
MISTRAL_OPEN, MISTRAL_ARGS, MISTRAL_CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
XML_FUNCTION, XML_PARAMETER = "<function=", "<parameter="
GLM_KEY, GLM_KEY_CLOSE, GLM_VALUE, GLM_VALUE_CLOSE = "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"


@dataclass(frozen=True)
class GemmaTags:
    open: str
    close: str
    mark: str  # around a string value
    sign: str  # what the template writes that says it is this format


GEMMA_TAGS = {"gemma4": GemmaTags("<|tool_call>", "<tool_call|>", '<|"|>', "<|tool_call>call:"),
              "functiongemma": GemmaTags("<start_function_call>", "<end_function_call>", "<escape>",
                                         "<start_function_call>")}

# What Llama 3.1/3.2/3.3's templates tell the model, in their own words.
LLAMA3_SIGN = '"parameters": dictionary of argument name'
# A JSON object with "name" (or "arguments") inside the tags, as Hermes templates show the model
# (written in Jinja strings, so quotes and newlines may be escaped).
_HERMES_JSON = re.compile(r'<tool_call>(?:\s|\\n)*\{\{?\\?"(?:name|arguments)\\?"'
                          r'|\{\{?\\?"name\\?": <function-name>, \\?"arguments\\?"')
_HERMES_CALL = re.compile(re.escape(HERMES_OPEN) + r"\s*(.*?)\s*" + re.escape(HERMES_CLOSE), re.DOTALL)
_MISTRAL_ID = re.compile(r"^[a-zA-Z0-9]{9}$")
_ALNUM = string.ascii_letters + string.digits


@dataclass(frozen=True)
class NativeFormat:
    name: str  # hermes, qwen3-coder, glm, lfm2, mistral, mistral-args, gemma4, functiongemma, llama3, harmony
    open_token: int | None = None  # the token that opens the calls (None: llama3's answer is the call)
    args_token: int | None = None  # mistral-args: [ARGS]
    call_id_token: int | None = None  # mistral-args, where the template has [CALL_ID]
    close_token: int | None = None  # gemma4, functiongemma: a call's closing tag; lfm2: the calls' one
    quote_token: int | None = None  # their string mark, where the vocabulary has it as one token
    tag_tokens: tuple[int, ...] = ()  # glm: its tags that are tokens; harmony: HARMONY_TAGS' (written out)

    @property
    def args_key(self) -> str:
        """The key of a call's arguments in its JSON object."""
        return "parameters" if self.name == "llama3" else "arguments"

    @property
    def parallel(self) -> bool:
        """Whether one answer may hold several calls (Llama 3.x's templates refuse them; gpt-oss's
        take one a message)."""
        return self.name not in ("llama3", "harmony")

    @property
    def marker(self) -> str | None:
        """The text that opens the calls in the answer (None: the answer is the call)."""
        if self.tags is not None:
            return self.tags.open
        return {"hermes": HERMES_OPEN, "qwen3-coder": HERMES_OPEN, "glm": HERMES_OPEN, "lfm2": LFM2_OPEN,
                "harmony": HARMONY_CALL, "mistral": MISTRAL_OPEN,
                "mistral-args": MISTRAL_OPEN}.get(self.name)

    @property
    def tags(self) -> GemmaTags | None:
        """A Gemma format's tags (None: not one)."""
        return GEMMA_TAGS.get(self.name)

    @property
    def shown_tokens(self) -> tuple[int, ...]:
        """The format's tokens, written out in the answer's text although they may be control tokens."""
        return tuple(t for t in (self.open_token, self.args_token, self.call_id_token, self.close_token,
                                 self.quote_token) if t is not None) + self.tag_tokens

    def new_id(self) -> str:
        if self.name.startswith("mistral"):
            return "".join(secrets.choice(_ALNUM) for _ in range(9))
        return f"call_{uuid.uuid4().hex[:24]}"


def _one_token(vocab: Vocab, text: str) -> int | None:
    ids = vocab.tokenize(text, add_special=False, parse_special=True)
    return ids[0] if len(ids) == 1 else None


def detect(template_source: str, vocab: Vocab) -> NativeFormat | None:
    """The model's own tool-call format, when its template renders tools in one this server reads
    and its vocabulary has the format's tags as single tokens."""
    if "tools" not in template_source:
        return None
    if HERMES_OPEN in template_source and HERMES_CLOSE in template_source:
        if XML_FUNCTION in template_source and XML_PARAMETER in template_source:
            name = "qwen3-coder"
        elif GLM_KEY in template_source and GLM_VALUE in template_source:
            token = _one_token(vocab, HERMES_OPEN)
            tags = (HERMES_CLOSE, GLM_KEY, GLM_KEY_CLOSE, GLM_VALUE, GLM_VALUE_CLOSE)
            shown = tuple(t for t in (_one_token(vocab, tag) for tag in tags) if t is not None)
            return NativeFormat("glm", token, tag_tokens=shown) if token is not None else None
        elif _HERMES_JSON.search(template_source):
            name = "hermes"
        else:
            return None  # another body inside the tags
        token = _one_token(vocab, HERMES_OPEN)
        return NativeFormat(name, token) if token is not None else None
    if MISTRAL_OPEN in template_source:
        token = _one_token(vocab, MISTRAL_OPEN)
        if token is None:
            return None
        if MISTRAL_ARGS not in template_source:
            return NativeFormat("mistral", token)
        args = _one_token(vocab, MISTRAL_ARGS)
        call_id = _one_token(vocab, MISTRAL_CALL_ID) if MISTRAL_CALL_ID in template_source else None
        return NativeFormat("mistral-args", token, args, call_id) if args is not None else None
    for name, tags in GEMMA_TAGS.items():
        if tags.sign in template_source:
            open_token, close_token = _one_token(vocab, tags.open), _one_token(vocab, tags.close)
            if open_token is None or close_token is None:
                return None
            return NativeFormat(name, open_token, close_token=close_token, quote_token=_one_token(vocab, tags.mark))
    if "<|channel|>commentary" in template_source and "<|call|>" in template_source:  # gpt-oss
        tokens = tuple(_one_token(vocab, tag) for tag in HARMONY_TAGS)
        return NativeFormat("harmony", tag_tokens=tokens) if None not in tokens else None
    if LFM2_SIGN in template_source:
        open_token, close_token = _one_token(vocab, LFM2_OPEN), _one_token(vocab, LFM2_CLOSE)
        if open_token is None or close_token is None:
            return None
        return NativeFormat("lfm2", open_token, close_token=close_token)
    if LLAMA3_SIGN in template_source:
        return NativeFormat("llama3")
    return None


def format_of(template: ChatTemplate, vocab: Vocab) -> NativeFormat | None:
    """`detect` for a loaded model (its template and vocabulary)."""
    return detect(template.source, vocab)


def template_tools(req: ChatRequest) -> list[dict[str, Any]]:
    """The request's tools as chat templates take them (OpenAI's form, unset fields left out)."""
    out = []
    for tool in req.tools or []:
        fn: dict[str, Any] = {"name": tool.function.name}
        if tool.function.description:
            fn["description"] = tool.function.description
        fn["parameters"] = tool.function.parameters if tool.function.parameters is not None else {
            "type": "object", "properties": {}}
        out.append({"type": "function", "function": fn})
    return out


def mistral_id(call_id: str) -> str:
    """A call id as Mistral's templates take it (9 letters and digits): itself when it is one,
    else one derived from it, the same every time."""
    if _MISTRAL_ID.match(call_id):
        return call_id
    n = int.from_bytes(hashlib.sha256(call_id.encode("utf-8")).digest()[:8], "big")
    out = []
    for _ in range(9):
        n, k = divmod(n, len(_ALNUM))
        out.append(_ALNUM[k])
    return "".join(out)


def conversation(fmt: NativeFormat, messages: list[dict[str, str]], raw: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages for a template that renders tool turns itself: an assistant's calls as
    `tool_calls` with their arguments as objects (templates write them with `tojson`), tool
    results as `tool` messages; Mistral's templates get their kind of ids. A result without a
    `tool_call_id` (Ollama's clients send none) takes the id of the call it answers: the
    unanswered call of its `name`, else the first unanswered one."""
    fix_id = mistral_id if fmt.name.startswith("mistral") else (lambda i: i)
    out: list[dict[str, Any]] = []
    unanswered: list[dict[str, Any]] = []
    for msg, plain in zip(raw, messages):
        if msg.role == "assistant" and msg.tool_calls and fmt.name == "lfm2":  # its template renders content only
            written = pythonic_calls.written([(c.function.name, arguments_value(c.function.arguments))
                                              for c in msg.tool_calls])
            out.append({"role": "assistant", "content": (plain["content"] or "") + written})
        elif msg.role == "assistant" and msg.tool_calls:
            calls = [{"id": fix_id(c.id or f"call_{k}"), "type": "function",
                      "function": {"name": c.function.name, "arguments": arguments_value(c.function.arguments)}}
                     for k, c in enumerate(msg.tool_calls)]
            unanswered = list(calls)
            out.append({"role": "assistant", "content": plain["content"], "tool_calls": calls})
        elif msg.role == "tool":
            call_id = fix_id(msg.tool_call_id) if msg.tool_call_id else _answered(unanswered, msg.name)
            unanswered = [c for c in unanswered if c["id"] != call_id]
            out.append({"role": "tool", "content": plain["content"],
                        **({"tool_call_id": call_id} if call_id else {}),
                        **({"name": msg.name} if msg.name else {})})
        else:
            out.append(plain)
    return out


def _answered(unanswered: list[dict[str, Any]], name: str | None) -> str | None:
    """The id of the call a result with no id answers (None: no call is left)."""
    named = [c for c in unanswered if c["function"]["name"] == name]
    pick = named or unanswered
    return pick[0]["id"] if pick else None


def arguments_value(text: str) -> Any:
    """A call's arguments (JSON text, as OpenAI sends them) as the value they encode; text that
    is not JSON as it is."""
    try:
        return json.loads(text)
    except ValueError:
        return text


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
    ok = isinstance(call_id, str) and _MISTRAL_ID.match(call_id) and fmt.name.startswith("mistral")
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
    """How a format writes a call's name and parameters inside `<tool_call>` tags, a string
    parameter's value as its raw text and other values as JSON."""

    head: re.Pattern  # the call's body up to its name, once the name is whole (group 1)
    head_start: str  # what the body opens with before the name
    call: re.Pattern  # a whole call's body (group 1: the name, group 2: its parameters)
    parameter: re.Pattern  # a closed parameter (group 1: its key, group 2: its value)
    opened: re.Pattern  # a parameter up to where its value starts
    value_ends: tuple[str, ...]  # what may close a value (a tail that may be one is held back)
    framed_newline: bool  # a value's first newline is the frame's, not the value's


XML_SHAPES = {
    "qwen3-coder": XmlShape(re.compile(r"\s*<function=([^>\n]+)>"), XML_FUNCTION,
                            re.compile(r"<function=([^>\n]+)>(.*?)</function>", re.DOTALL),
                            re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.DOTALL),
                            re.compile(r"<parameter=([^>\n]+)>"), ("\n</parameter>", "</parameter>"), True),
    "glm": XmlShape(re.compile(r"\s*([^<\n]+)(?=[\n<])"), "",
                    re.compile(r"([^<\n]+?)\s*((?:<arg_key>.*?</arg_value>\s*)*)", re.DOTALL),
                    re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL),
                    re.compile(r"<arg_key>([^<]*)</arg_key>\s*<arg_value>"), (GLM_VALUE_CLOSE,), False),
}


def _xml_calls(shape: XmlShape, text: str, tools: list[dict[str, Any]] | None) -> list[Begun]:
    """Calls in an XML-like format (qwen3-coder's, GLM's): each named once its name is whole,
    its arguments as they are written (_xml_arguments_so_far), whole when its tag closes."""
    schemas = _parameters_of(tools)
    out = []
    for block in text.split(HERMES_OPEN)[1:]:
        head = shape.head.match(block)
        if head is None:
            begun = block.lstrip()
            if not (shape.head_start.startswith(begun[:len(shape.head_start)]) and ">" not in begun
                    and (shape.head_start or "<" not in begun)):
                raise ValueError("not a function block")
            break
        name = head.group(1).strip()
        props = schemas.get(name, {})
        body, close, rest = block.partition(HERMES_CLOSE)
        if not close:
            out.append(Begun(name, _xml_arguments_so_far(shape, block[head.end():], props), False))
            break
        call = shape.call.fullmatch(body.strip())
        if call is None or rest.strip():
            raise ValueError("not a function block")
        args = {m.group(1).strip(): _xml_value(m.group(2), props.get(m.group(1).strip()))
                for m in shape.parameter.finditer(call.group(2))}
        out.append(Begun(name, json.dumps(args, ensure_ascii=False), True))
    return out


def _xml_arguments_so_far(shape: XmlShape, body: str, props: dict[str, Any]) -> str:
    """The JSON text of an open call's arguments so far: its parameters closed so far, and a
    string parameter being written up to where its text is sure (not the newline before a
    closing tag, nor what may be the tag's beginning). It never has its closing brace: it is a
    prefix of the whole call's arguments, which are json.dumps of the same values."""
    parts, last = [], 0
    for m in shape.parameter.finditer(body):
        key = m.group(1).strip()
        parts.append(json.dumps(key, ensure_ascii=False) + ": "
                     + json.dumps(_xml_value(m.group(2), props.get(key)), ensure_ascii=False))
        last = m.end()
    open_param = shape.opened.search(body, last)
    text = "{" + ", ".join(parts)
    if open_param is None or not xml_written_as_text(props.get(open_param.group(1).strip())):
        return text
    raw = body[open_param.end():]
    if not raw:
        return text
    if shape.framed_newline and raw.startswith("\n"):
        raw = raw[1:]
    raw = raw[:len(raw) - partial_suffix(raw, list(shape.value_ends))]
    if parts:
        text += ", "
    key = json.dumps(open_param.group(1).strip(), ensure_ascii=False)
    return text + key + ": " + json.dumps(raw, ensure_ascii=False)[:-1]


def _mistral(fmt: NativeFormat, text: str) -> list[Begun]:
    """Mistral's calls, each once it is whole (the id the model may write comes after the arguments)."""
    i = skip_blanks(text, len(MISTRAL_OPEN))
    if i == len(text):
        return []
    found, end = elements(text, i)
    out = []
    for start, stop in found:
        if stop is None:
            break
        call, _ = json_call(text, start)
        out.append(replace(call, call_id=_model_id(fmt, call.call_id)))
    if end is not None and text[end:].strip():
        raise ValueError("text after the calls")
    return out


def _mistral_args(fmt: NativeFormat, text: str) -> list[Begun]:
    out = []
    for block in text.split(MISTRAL_OPEN)[1:]:
        head, sep, args = block.partition(MISTRAL_ARGS)
        if not sep:
            break
        name, _, call_id = head.partition(MISTRAL_CALL_ID)
        i = skip_blanks(args, 0)
        end = value_end(args, i)
        whole = end is not None
        if whole and (args[end:].strip() or not isinstance(json.loads(args[i:end]), dict)):
            raise ValueError("not a call's arguments")
        out.append(Begun(name.strip(), compact_json(args[i:end]), whole, _model_id(fmt, call_id or None)))
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
    """LFM2's calls, all whole once their list closes (its Python notation is read by Python's
    parser, which takes only a whole list)."""
    body, close, rest = text[len(LFM2_OPEN):].partition(LFM2_CLOSE)
    if not close:
        return []
    if rest.strip():
        raise ValueError("text after the calls")
    return [Begun(name, json.dumps(args, ensure_ascii=False), True) for name, args in pythonic_calls.read(body)]


def _harmony(text: str) -> list[Begun]:
    """gpt-oss's call: `<|channel|>commentary to=functions.name <|constrain|>json<|message|>{...}`
    (generation ends at its `<|call|>`), named once its header is whole."""
    rest = text[len(HARMONY_CALL):]
    head = _HARMONY_HEAD.match(rest)
    if head is None:
        name = re.match(r"[^\s<]+(?=[\s<])", rest)
        return [Begun(name.group(), "", False)] if name else []
    args = rest[head.end():].removesuffix("<|call|>")
    i = skip_blanks(args, 0)
    end = value_end(args, i)
    if end is not None and (args[end:].strip() or not isinstance(json.loads(args[i:end]), dict)):
        raise ValueError("not a call's arguments")
    return [Begun(head.group(1), compact_json(args[i:end]), end is not None)]


def begun_calls(fmt: NativeFormat, text: str, tools: list[dict[str, Any]] | None = None) -> list[Begun]:
    """The calls written so far in `text`, from the format's marker on, cut anywhere (`tools`: the
    request's, as templates take them, which say how qwen3-coder's values read). ValueError (or
    KeyError, TypeError) where they do not read."""
    if fmt.name == "hermes":
        return _hermes(text)
    if fmt.name in XML_SHAPES:
        return _xml_calls(XML_SHAPES[fmt.name], text, tools)
    if fmt.name == "mistral":
        return _mistral(fmt, text)
    if fmt.name == "mistral-args":
        return _mistral_args(fmt, text)
    if fmt.tags is not None:
        return _gemma(fmt, text)
    if fmt.name == "lfm2":
        return _lfm2(text)
    if fmt.name == "harmony":
        return _harmony(text)
    i = skip_blanks(text, 0)  # llama3: the answer is the call
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
    return len(text) - len(stripped) if stripped.startswith("{") else -1


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
    that begins with `{` is a call); the calls go out as they are written (`stream_calls`,
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
        if marker is None:
            stripped = self.text.lstrip()
            end = 0 if not stripped or stripped.startswith("{") else len(self.text)
        else:
            start = self.text.find(marker)
            end = start if start >= 0 else len(self.text) - partial_suffix(self.text, [marker])
            end = len(self.text[:end].rstrip())  # blanks before a call are not content
        new = self.text[self.sent:end] if end > self.sent else ""
        self.sent += len(new)
        start = _calls_start(self.fmt, self.text)
        if self.streaming and start >= 0:
            self.follow(lambda: begun_calls(self.fmt, self.text[start:], self.tools))
        return new

    def finish(self, finish_reason: str) -> tuple[str | None, list[ToolCall] | None, str]:
        start, whole = _whole_calls(self.fmt, self.text, finish_reason, self.tools)
        if whole is not None:
            return self.text[:start].rstrip()[self.sent:] or None, self.settle(whole), "tool_calls"
        if self.sent_calls is not None:
            return None, self.sent_calls, finish_reason
        return self.text[self.sent:], None, finish_reason
