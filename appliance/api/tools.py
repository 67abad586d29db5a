"""Tool calls (OpenAI `tools`, `tool_choice`); in the model's own format where its template has
one this server reads (api/native_tools.py), else in EIE's format, described below.

The tools are described in the system message; the answer is held by a grammar (built from the
tools' parameter schemas by engine/schema_grammar.py) to one JSON object: {"tool_calls": [{"name",
"arguments"}, ...]} or, where the model may answer directly (`auto`), {"response": "..."}; that
object is read back into `tool_calls` or `content`. With a `response_format` under `auto`, the
direct answer is the JSON that format asks for instead of {"response": ...}, in either kind of
format: the answer is the calls or that JSON (`ToolPlan.reply`). History in OpenAI's form (assistant messages
with `tool_calls`, `tool` messages with results) is written in the same terms, as user and
assistant turns every chat template can render.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from functools import partial
from typing import Any

from ..engine.gbnf_names import prefixed_rules
from ..engine.schema_grammar import OWN_ROOT, SchemaError, schema_to_gbnf
from . import native_answers, native_grammars, native_tools, pythonic_calls
from .errors import ApiError, bad_request
from .call_stream import READ_ERRORS, Begun, CallReader, elements, json_call, members, skip_blanks, tool_calls
from .native_tools import NativeFormat
from .schemas import ChatMessage, ChatRequest, Tool, ToolCall, ToolChoice

NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
ANY_OBJECT = {"type": "object"}


@dataclass(frozen=True)
class ToolPlan:
    mode: str  # "auto", "required" or "named"
    grammar: str
    instructions: str  # for the system message (EIE's format)
    native: NativeFormat | None = None  # the model's own format: its template lists the tools
    template_tools: list[dict[str, Any]] | None = None
    triggers: tuple[int | str, ...] = ()  # the grammar waits for one of these tokens or texts (grammar.Constraint)
    # A direct answer is the JSON the request's response_format asks for (the grammar: calls or that)
    reply: bool = False

    @property
    def shown_tokens(self) -> tuple[int, ...]:
        """Tokens the answer's text must show for it to be read back (the format's control tokens)."""
        return self.native.shown_tokens if self.native else ()

    def reader(self, stream_calls: bool = False) -> "AnswerReader | native_answers.AnswerReader":
        """A reader of the answer as it streams (`stream_calls`: calls go out as they are written)."""
        if self.native:
            return native_answers.AnswerReader(self.native, self.template_tools, stream_calls)
        return AnswerReader(stream_calls, self.reply)

    def read(self, text: str, finish_reason: str) -> tuple[str | None, list[ToolCall] | None, str]:
        if self.native:
            return native_answers.read_answer(self.native, text, finish_reason, self.template_tools)
        return read_answer(text, finish_reason, self.reply)


def plan(req: ChatRequest, native: NativeFormat | None = None, think_budget: int = -1,
         reply: str | None = None) -> ToolPlan | None:
    """What the request's tools ask of the answer; None when no tool may be called. With `native`
    the answer is held to the model's own format, else to EIE's (`think_budget`: the tokens a
    format whose grammar holds the thinking, gpt-oss's, lets it have; -1: no bound). `reply`: the
    grammar of the request's response_format or its own `grammar`, which a direct answer follows
    under `auto` (under `required` or a named function the answer is a call, and the format is for
    a later turn). A direct answer that is itself a JSON object of calls reads as calls."""
    choice = req.tool_choice
    if not req.tools:
        if choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools", param="tool_choice")
        return None
    names = []
    for i, tool in enumerate(req.tools):
        if tool.type != "function":
            raise bad_request(f"tool type {tool.type!r} is not supported (function only)", param=f"tools[{i}].type")
        name = tool.function.name
        if not NAME.match(name):
            raise bad_request(f"function name {name!r} must be 1-64 letters, digits, '_' or '-'",
                              param=f"tools[{i}].function.name")
        if name in names:
            raise bad_request(f"function name {name!r} is given twice", param=f"tools[{i}].function.name")
        if not _takes_an_object(tool.function.parameters):  # a call's arguments are an object
            raise bad_request(f"tools[{i}].function.parameters: a function's parameters must be an object schema "
                              "(type: object)", param=f"tools[{i}].function.parameters")
        names.append(name)
    named = None
    if choice is None or choice == "auto":
        mode = "auto"
    elif choice == "none":
        return None
    elif choice == "required":
        mode = "required"
    elif isinstance(choice, ToolChoice):
        if choice.type != "function" or choice.function is None:
            raise bad_request("tool_choice must be none, auto, required or {type: function, function: {name}}",
                              param="tool_choice")
        if choice.function.name not in names:
            raise bad_request(f"tool_choice names function {choice.function.name!r}, which is not in tools",
                              param="tool_choice.function.name")
        mode, named = "named", choice.function.name
    else:
        raise bad_request("tool_choice must be none, auto, required or {type: function, function: {name}}",
                          param="tool_choice")
    if mode != "auto":
        reply = None
    callable_tools = [i for i, t in enumerate(req.tools) if named is None or t.function.name == named]
    for i, tool in enumerate(req.tools):  # the grammar below checks the callable ones
        if i not in callable_tools and tool.function.parameters is not None:
            _convert(tool.function.parameters, {"": i})
    if native is not None:
        return _native_plan(req, native, mode, callable_tools, req.parallel_tool_calls and named is None, think_budget,
                            reply)
    calls = [{"type": "object", "properties": {"name": {"const": req.tools[i].function.name},
                                                "arguments": {OWN_ROOT: _parameters(req.tools[i])}},
              "required": ["name", "arguments"]} for i in callable_tools]
    call_list = {"type": "array", "items": calls[0] if len(calls) == 1 else {"anyOf": calls}, "minItems": 1}
    if not req.parallel_tool_calls or named is not None:
        call_list["maxItems"] = 1
    with_calls = {"type": "object", "properties": {"tool_calls": call_list}, "required": ["tool_calls"]}
    answer = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"]}
    schema = {"anyOf": [with_calls, answer]} if mode == "auto" and reply is None else with_calls
    # where each callable tool's parameters sit in `schema`, for an error's path
    items = ("anyOf.0." if schema is not with_calls else "") + "properties.tool_calls.items"
    where = {f"{items}{f'.anyOf.{k}' if len(calls) > 1 else ''}.properties.arguments": i
             for k, i in enumerate(callable_tools)}
    gbnf = _convert(schema, where)
    if reply is not None:
        kind = "grammar" if req.grammar is not None else "json"
        return ToolPlan(mode, calls_or_reply(gbnf, reply), _instructions(req, mode, named, kind), reply=True)
    return ToolPlan(mode, gbnf, _instructions(req, mode, named))


def calls_or_reply(calls: str, reply: str) -> str:
    """One grammar from two: the calls' (start symbol `root`) or the reply's (the request's
    response_format or grammar), their rules apart."""
    return ("root ::= calls-root | reply-root\n" + prefixed_rules(calls, "calls-").rstrip("\n") + "\n"
            + prefixed_rules(reply, "reply-"))


def _native_plan(req: ChatRequest, native: NativeFormat, mode: str, callable_tools: list[int],
                 parallel: bool, think_budget: int, reply: str | None) -> ToolPlan:
    """The plan for a model's own format: its grammar over the callable tools; with `reply`, the
    calls (from the answer's start) or the reply, in one grammar that holds the whole answer."""
    if reply is not None and native.name == "harmony":
        field = "grammar" if req.grammar is not None else "response_format"
        raise bad_request(f"{field} is not supported together with tools for gpt-oss's format (its answer "
                          "has channels of its own)", param=field)
    parallel = parallel and native.parallel
    xml = partial(native_grammars.xml_grammar, native)
    builders = {"qwen3-coder": xml, "glm": xml, "minicpm5": xml, "seed-oss": xml, "minimax": xml,
                "gemma4": partial(native_grammars.gemma_grammar, native),
                "functiongemma": partial(native_grammars.gemma_grammar, native),
                "mistral-args": partial(native_grammars.args_grammar, native),
                "kimi-k2": partial(native_grammars.kimi_grammar, native),
                "deepseek-r1": partial(native_grammars.deepseek_grammar, native),
                "lfm2": partial(pythonic_calls.grammar, native.open_token, native.close_token),
                "harmony": partial(native_grammars.harmony_grammar, native, mode == "auto", think_budget)}
    if native.name in builders:  # calls that are not JSON objects: each function's arguments apart
        try:
            gbnf = builders[native.name]([(req.tools[i].function.name, _parameters(req.tools[i]))
                                          for i in callable_tools], parallel)
        except SchemaError as e:
            k, _, rest = e.path.partition(".")
            raise _schema_error(callable_tools[int(k)], rest, e.reason) from None
    else:
        calls = [native_grammars.call_schema(native, req.tools[i].function.name, {OWN_ROOT: _parameters(req.tools[i])})
                 for i in callable_tools]
        one = calls[0] if len(calls) == 1 else {"anyOf": calls}
        # where each call's arguments sit (Apertus': under the function's name)
        where = {(f"anyOf.{k}." if len(calls) > 1 else "")
                 + f"properties.{req.tools[i].function.name if native.name == 'apertus' else native.args_key}": i
                 for k, i in enumerate(callable_tools)}
        gbnf = native_grammars.grammar(native, _convert(one, where), parallel, mode == "auto" and reply is None)
    if reply is not None:
        return ToolPlan(mode, calls_or_reply(gbnf, reply), "", native, native_tools.template_tools(req), reply=True)
    triggers = (native.trigger,) if mode == "auto" and native.trigger is not None else ()
    return ToolPlan(mode, gbnf, "", native, native_tools.template_tools(req), triggers)


def _takes_an_object(params: Any) -> bool:
    """Whether a parameters schema may describe an object: none, {}, or one whose type is or
    includes object (a type left out: one its keywords make an object's)."""
    if params is None or params == {} or params is True:
        return True
    if not isinstance(params, dict):
        return False
    types = params.get("type", "object")
    return types == "object" or (isinstance(types, list) and "object" in types)


def _parameters(tool: Tool) -> Any:
    """The tool's parameters schema; none or {} allow any object (arguments are an object)."""
    params = tool.function.parameters
    return ANY_OBJECT if params is None or params == {} else params


def _convert(schema: dict, tools_at: dict[str, int]) -> str:
    """The GBNF for `schema`; a SchemaError inside a tool's parameters (`tools_at`: their paths in
    `schema`, and the tool's index) is a 400 naming the path under `tools[i].function.parameters`."""
    try:
        return schema_to_gbnf(schema)
    except SchemaError as e:
        for at, i in tools_at.items():
            if e.path == at or at == "" or e.path.startswith(at + "."):
                raise _schema_error(i, e.path[len(at):].lstrip("."), e.reason) from None
        raise bad_request(f"tools: {e.reason}", param="tools") from None


def _schema_error(tool: int, path: str, reason: str) -> ApiError:
    """A 400 naming the place in tools[tool]'s parameters that the grammar cannot express."""
    param = f"tools[{tool}].function.parameters" + (f".{path}" if path else "")
    return bad_request(f"{param}: {reason}", param=param)


def _instructions(req: ChatRequest, mode: str, named: str | None, reply: str | None = None) -> str:
    """The system message's description of the tools and of the answer's JSON; `reply`: what a
    direct answer is instead under `auto` (json: the response_format's; grammar: the request's)."""
    listed = [{"name": t.function.name, **({"description": t.function.description} if t.function.description else {}),
               "parameters": _parameters(t)} for t in req.tools or []]
    text = ("You can call these functions (JSON):\n" + json.dumps(listed, ensure_ascii=False) + "\n\n"
            'Reply with one JSON object. To call functions: {"tool_calls": [{"name": "<function name>", '
            '"arguments": {<its parameters>}}]}.')
    if mode == "auto" and reply:
        how = " in JSON" if reply == "json" else ""
        text += f" To answer without calling a function, reply with your answer{how} instead."
    elif mode == "auto":
        text += ' To answer without calling a function: {"response": "<your answer>"}.'
    elif named is not None:
        text += f" Call the function {named}."
    return text


def conversation(messages: list[dict[str, str]], raw: list[ChatMessage], tools: ToolPlan | None,
                 native: NativeFormat | None = None) -> list[dict[str, Any]]:
    """Messages (already plain text) with OpenAI's tool turns: for a model with its own format
    (`native`), as its template takes them; else written as user and assistant turns: an
    assistant's tool calls as the JSON it would answer with, tool results as a user turn
    (consecutive ones, and a user message right after them, in one), and the instructions in the
    system message when tools apply."""
    if native is not None:
        return native_tools.conversation(native, messages, raw)
    out: list[dict[str, str]] = []
    called: dict[str, str] = {}  # tool_call_id -> function name
    for msg, plain in zip(raw, messages):
        if msg.role == "assistant" and msg.tool_calls:
            for c in msg.tool_calls:
                if c.id:
                    called[c.id] = c.function.name
            calls = [{"name": c.function.name, "arguments": native_tools.arguments_value(c.function.arguments)}
                     for c in msg.tool_calls]
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)})
        elif msg.role == "assistant" and tools is not None:
            out.append({"role": "assistant", "content": json.dumps({"response": plain["content"]}, ensure_ascii=False)})
        elif msg.role == "tool":
            name = msg.name or called.get(msg.tool_call_id or "", "a function")
            line = f"Result of {name}: {plain['content']}"
            if out and out[-1].get("tool_results"):
                out[-1]["content"] += "\n" + line
            else:
                out.append({"role": "user", "content": line, "tool_results": "1"})
        elif msg.role == "user" and out and out[-1].get("tool_results"):
            out[-1]["content"] += "\n\n" + plain["content"]  # one user turn: templates may need turns to alternate
        else:
            out.append(plain)
    out = [{"role": m["role"], "content": m["content"]} for m in out]
    if tools is not None:
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + tools.instructions}
        else:
            out.insert(0, {"role": "system", "content": tools.instructions})
    return out


RESPONSE_START = re.compile(r'\s*\{\s*"response"\s*:\s*"')


def _string_body(raw: str) -> tuple[str, bool]:
    """The longest prefix of a JSON string's body (after its opening quote) that decodes on its
    own, and whether the closing quote was reached: a cut escape (or a high surrogate whose low
    half has not come) waits for the rest. The grammar made every escape a valid one."""
    i, n = 0, len(raw)
    while i < n:
        ch = raw[i]
        if ch == '"':
            return raw[:i], True
        if ch == "\\":
            if i + 1 >= n:
                break
            if raw[i + 1] == "u":
                if i + 6 > n:
                    break
                if 0xD800 <= int(raw[i + 2 : i + 6], 16) < 0xDC00 and i + 12 > n:
                    break
                i += 12 if 0xD800 <= int(raw[i + 2 : i + 6], 16) < 0xDC00 else 6
                continue
            i += 2
            continue
        i += 1
    return raw[:i], False


def begun_calls(text: str) -> list[Begun]:
    """The calls written so far in an answer held to a ToolPlan's grammar, cut anywhere (none in a
    direct answer). ValueError where they do not read."""
    i = skip_blanks(text, 0)
    if i == len(text):
        return []
    found, _ = members(text, i)
    at = found.get("tool_calls")
    if at is None:
        return []
    listed, _ = elements(text, at[0])
    out = []
    for start, _ in listed:
        call, _ = json_call(text, start)
        if call is None:
            break
        out.append(call)
    return out


CALLS_KEY = '{"tool_calls"'


def _opens_calls(text: str) -> bool | None:
    """Whether an answer held to a reply plan's grammar is tool calls (True), the reply (False),
    or cannot tell yet (None): calls begin with their key, the blanks the grammar allows aside."""
    compact = "".join(text.split())
    if compact.startswith(CALLS_KEY):
        return True
    return None if CALLS_KEY.startswith(compact) else False


class AnswerReader(CallReader):
    """Reads an answer held to a ToolPlan's grammar as it streams: a direct answer's text
    ({"response": "..."}, decoded; with `reply`, the response_format's JSON as it is) goes out as
    it comes; tool calls go out as they are written (`stream_calls`, call_stream.CallReader) or
    whole at the end."""

    def __init__(self, stream_calls: bool = False, reply: bool = False) -> None:
        super().__init__(_new_id, stream_calls)
        self.text = ""
        self.sent = 0  # characters of the decoded response already given out
        self.decoded_to: int | None = None  # where in `text` the response's string is decoded to
        self.closed = False  # its closing quote has come
        self.reply = reply
        self.calls: bool | None = None  # with `reply`: whether the answer is calls (None: not known yet)

    def push(self, piece: str) -> str:
        """The part of the direct answer's text that `piece` completes ("" while it is not known
        to be one, or for tool calls). The response's string is decoded from where the last
        piece left it, so a long answer costs what its length does, not its square."""
        self.text += piece
        if self.reply:
            if self.calls is None:
                self.calls = _opens_calls(self.text)
            if self.calls is False:
                new, self.sent = self.text[self.sent:], len(self.text)
                return new
            if self.calls:
                self.follow(lambda: begun_calls(self.text), len(self.text))
            return ""
        if self.decoded_to is None:
            m = RESPONSE_START.match(self.text)
            if not m:
                self.follow(lambda: begun_calls(self.text), len(self.text))
                return ""
            self.decoded_to = m.end()
        if self.closed:
            return ""
        body, self.closed = _string_body(self.text[self.decoded_to:])
        self.decoded_to += len(body)
        new = json.loads('"' + body + '"')
        self.sent += len(new)
        return new

    def finish(self, finish_reason: str) -> tuple[str | None, list[ToolCall] | None, str]:
        """(content not given out yet, tool_calls, finish_reason) once the answer is whole."""
        whole = _whole_calls(self.text, finish_reason)
        if whole is not None:
            return None, self.settle(whole), "tool_calls"
        if self.sent_calls is not None:
            return None, self.sent_calls, finish_reason
        if self.streamer is not None and finish_reason != "stop" and _opens_calls(self.text) is not False:
            return None, None, finish_reason  # cut short before its first call's name was whole: no call, no text
        content, _, reason = read_answer(self.text, finish_reason, self.reply)
        return (content[self.sent :] if content is not None else None), None, reason


def _new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _whole_calls(text: str, finish_reason: str) -> list[Begun] | None:
    """The answer's calls where it is a whole object of them (None: it is not); one whose closing
    brace was the max_tokens-th token is whole all the same."""
    if finish_reason not in ("stop", "length"):
        return None
    try:
        obj = json.loads(text)
        begun = begun_calls(text) if isinstance(obj, dict) and "tool_calls" in obj else []
    except READ_ERRORS:
        return None
    return begun if begun and all(c.whole for c in begun) else None


def read_answer(text: str, finish_reason: str, reply: bool = False) -> tuple[str | None, list[ToolCall] | None, str]:
    """(content, tool_calls, finish_reason) from an answer held to a ToolPlan's grammar. A direct
    answer cut short (max_tokens, a stop string) is the text of its string so far; tool calls cut
    short are the JSON text as it is. With `reply`, a direct answer is its JSON text as it is."""
    whole = _whole_calls(text, finish_reason)
    if whole is not None:
        return None, tool_calls(whole, _new_id), "tool_calls"
    if reply:
        return text, None, finish_reason
    try:
        obj = json.loads(text) if finish_reason == "stop" else None
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        m = RESPONSE_START.match(text)
        if m:
            return json.loads('"' + _string_body(text[m.end():])[0] + '"'), None, finish_reason
        return text, None, finish_reason
    return obj.get("response", text), None, finish_reason
