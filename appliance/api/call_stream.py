"""Tool calls as they are written: each call goes out once its name is known, then its arguments
piece by piece (OpenAI's `tool_calls` deltas, the Responses API's `function_call_arguments.delta`,
Anthropic's `input_json_delta`), so that a client sees a long call (a file being written) grow
instead of waiting for the whole answer.

The formats' readers (api/tools.py, api/native_answers.py) say which calls a text holds so far
(`Begun`); `CallStreamer` turns that into deltas. The arguments are compact JSON text (json.dumps'
separators), the same whether the answer is read whole or streamed, so the deltas add up to the
whole call's arguments. The JSON scanners here read a text that may be cut anywhere.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Callable

from .schemas import FunctionCall, ToolCall

_BLANKS = " \t\n\r"


@dataclass(frozen=True)
class Begun:
    """A call begun in the answer: its name, its arguments so far (compact JSON text; "" where the
    format gives them only whole), whether it is closed, and the id the model wrote, if any."""

    name: str
    arguments: str
    whole: bool
    call_id: str | None = None


@dataclass(frozen=True)
class CallDelta:
    """What a call gained: its first delta carries its id and name."""

    index: int
    id: str | None
    name: str | None
    arguments: str


class CallStreamer:
    """Turns the calls begun so far into deltas, giving each call an id (`new_id`) when it first
    shows, unless the model wrote one."""

    def __init__(self, new_id: Callable[[], str]) -> None:
        self.new_id = new_id
        self.ids: list[str] = []
        self.names: list[str] = []
        self.sent: list[str] = []  # each call's arguments as they went out
        self.latest: list[str] = []  # and as last read (the same, unless a reading did not extend the last)

    def update(self, begun: list[Begun]) -> list[CallDelta]:
        out = []
        for k, call in enumerate(begun):
            if k == len(self.ids):
                self.ids.append(call.call_id or self.new_id())
                self.names.append(call.name)
                self.sent.append(call.arguments)
                self.latest.append(call.arguments)
                out.append(CallDelta(k, self.ids[k], call.name, call.arguments))
                continue
            self.latest[k] = call.arguments
            if call.arguments.startswith(self.sent[k]) and len(call.arguments) > len(self.sent[k]):
                out.append(CallDelta(k, None, None, call.arguments[len(self.sent[k]):]))
                self.sent[k] = call.arguments
        return out

    @property
    def started(self) -> bool:
        return bool(self.ids)

    def calls(self) -> list[ToolCall]:
        """The calls that went out, with their arguments as last read."""
        return [ToolCall(id=i, function=FunctionCall(name, args))
                for i, name, args in zip(self.ids, self.names, self.latest)]


def tool_calls(begun: list[Begun], new_id: Callable[[], str]) -> list[ToolCall]:
    """Whole calls (read at once) with ids: the model's own, else new ones."""
    return [ToolCall(id=c.call_id or new_id(), function=FunctionCall(c.name, c.arguments)) for c in begun]


# A JSON string (group 1: its closing quote, absent where the text ends inside it), a bracket,
# or a run of anything else. The readers rescan a call's text as it grows, so the scans go by
# these runs (in C) rather than by character.
_TOKEN = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*(")?|[{\[]|[}\]]|[^"{}\[\]]+', re.DOTALL)
_BLANK_RUN = re.compile(r"\s+")


def compact_json(raw: str) -> str:
    """JSON text (or a prefix of it) without its blanks between tokens and with json.dumps'
    separators: the compact form of a longer prefix extends that of a shorter one."""
    out = []
    for m in _TOKEN.finditer(raw):
        token = m.group()
        if token[0] == '"':
            out.append(token)
        else:
            out.append(_BLANK_RUN.sub("", token).replace(",", ", ").replace(":", ": "))
    return "".join(out)


def skip_blanks(text: str, i: int) -> int:
    while i < len(text) and text[i] in _BLANKS:
        i += 1
    return i


def _string_end(text: str, i: int) -> int | None:
    """Where the JSON string opened at `i` ends (after its quote); None: not yet."""
    m = _TOKEN.match(text, i)
    return m.end() if m.group(1) is not None else None


def value_end(text: str, i: int) -> int | None:
    """Where the JSON value that starts at `i` ends; None: not within `text` (a number or a
    literal ends only where something follows it)."""
    if i >= len(text):
        return None
    if text[i] == '"':
        return _string_end(text, i)
    if text[i] in "{[":
        depth = 0
        for m in _TOKEN.finditer(text, i):
            token = m.group()
            if token[0] == '"':
                if m.group(1) is None:
                    return None
            elif token in "{[":
                depth += 1
            elif token in "}]":
                depth -= 1
                if depth == 0:
                    return m.end()
        return None
    j = i
    while j < len(text) and text[j] not in _BLANKS + ",}]":
        j += 1
    return j if j < len(text) else None


Span = tuple[int, int | None]  # a value's start and end (None: it goes on past the text)


def members(text: str, i: int) -> tuple[dict[str, Span], int | None]:
    """The members of the JSON object opened at `i` found so far (each key's value span), and
    where the object ends (None: not within `text`). ValueError where it is not an object."""
    if text[i] != "{":
        raise ValueError("not an object")
    found: dict[str, Span] = {}
    j = skip_blanks(text, i + 1)
    while j < len(text):
        if text[j] == "}":
            return found, j + 1
        if text[j] == "," and found:
            j = skip_blanks(text, j + 1)
            continue
        if text[j] != '"':
            raise ValueError("not an object")
        key_end = _string_end(text, j)
        if key_end is None:
            break
        key = json.loads(text[j:key_end])
        j = skip_blanks(text, key_end)
        if j >= len(text):
            break
        if text[j] != ":":
            raise ValueError("not an object")
        j = skip_blanks(text, j + 1)
        if j >= len(text):
            break
        end = value_end(text, j)
        found[key] = (j, end)
        if end is None:
            break
        j = skip_blanks(text, end)
    return found, None


def elements(text: str, i: int) -> tuple[list[Span], int | None]:
    """The elements of the JSON array opened at `i` found so far, and where it ends (None: not
    within `text`). ValueError where it is not an array."""
    if text[i] != "[":
        raise ValueError("not an array")
    found: list[Span] = []
    j = skip_blanks(text, i + 1)
    while j < len(text):
        if text[j] == "]":
            return found, j + 1
        if text[j] == "," and found:
            j = skip_blanks(text, j + 1)
            continue
        end = value_end(text, j)
        found.append((j, end))
        if end is None:
            break
        j = skip_blanks(text, end)
    return found, None


def json_call(text: str, i: int, args_keys: tuple[str, ...] = ("arguments",),
              name_key: str = "name") -> tuple[Begun | None, int | None]:
    """The call written as a JSON object at `i` ({"name": ..., "arguments": {...}}, the name under
    `name_key`, the arguments under the first of `args_keys` it has) and where the object ends;
    None while its name is not whole. ValueError where a closed object is not a call."""
    found, end = members(text, i)
    name_at = found.get(name_key)
    if name_at is None or name_at[1] is None:
        if end is not None:
            raise ValueError("a call without a name")
        return None, None
    name = json.loads(text[name_at[0]:name_at[1]])
    if not isinstance(name, str):
        raise ValueError("a call's name is not a string")
    args_key = next((k for k in args_keys if k in found), args_keys[0])
    args_at = found.get(args_key)
    arguments = compact_json(text[args_at[0]:args_at[1] or len(text)]) if args_at else ""
    call_id = None
    if end is not None:
        obj = json.loads(text[i:end])
        if not isinstance(obj.get(args_key), dict):
            raise ValueError("a call's arguments are not an object")
        call_id = obj.get("id") if isinstance(obj.get("id"), str) else None
    return Begun(name, arguments, end is not None, call_id), end


def keyed_call(text: str, i: int) -> tuple[Begun | None, int | None]:
    """The call written as a JSON object at `i` whose one key is the function's name and its value
    the arguments ({"name": {...}}, Apertus'), and where the object ends; None while no value has
    begun. ValueError where a closed object is not such a call."""
    found, end = members(text, i)
    if not found:
        if end is not None:
            raise ValueError("a call without a name")
        return None, None
    if len(found) > 1:
        raise ValueError("a call with more than one name")
    ((name, (start, stop)),) = found.items()
    if end is not None and not isinstance(json.loads(text[start:stop]), dict):
        raise ValueError("a call's arguments are not an object")
    return Begun(name, compact_json(text[start:stop or len(text)]), end is not None), end


# How often a growing call's text is read again (CallReader.follow).
EAGER_CHARS = 4096
READ_SHARE = 256
READ_WAIT_NS = 250_000_000

READ_ERRORS = (ValueError, KeyError, TypeError, AttributeError, SyntaxError, RecursionError)


class CallReader:
    """The calls half of an answer reader that streams: with `stream_calls`, the calls begun so far
    go out as deltas (`take_calls`), and once one has gone out, the answer's end keeps them as
    calls even where it was cut short (their arguments as far as they were written, as OpenAI's
    streams end); without it, calls are read whole at the end."""

    def __init__(self, new_id: Callable[[], str], stream_calls: bool) -> None:
        self.new_id = new_id
        self.streamer = CallStreamer(new_id) if stream_calls else None
        self.pending: list[CallDelta] = []
        self.read_size = 0  # the calls' text when it was last read
        self.read_at = 0  # and when (monotonic ns)

    def follow(self, begun: Callable[[], list[Begun]], size: int) -> None:
        """Take in the calls begun so far, `size` characters of text (a text that does not read as
        calls is left to the end). Each reading reads the whole text, so past EAGER_CHARS it is
        read again only once it has grown by a READ_SHARE-th, or READ_WAIT_NS have passed: a long
        call (a file being written) costs a small multiple of its length, not its square, and
        its deltas come in pieces of that size."""
        if self.streamer is None:
            return
        now = time.monotonic_ns()
        grown = size - self.read_size
        if size > EAGER_CHARS and grown * READ_SHARE < size and now - self.read_at < READ_WAIT_NS:
            return
        self.read_size, self.read_at = size, now
        try:
            self.pending += self.streamer.update(begun())
        except READ_ERRORS:
            pass

    def take_calls(self) -> list[CallDelta]:
        out, self.pending = self.pending, []
        return out

    def settle(self, whole: list[Begun]) -> list[ToolCall]:
        """The answer's calls, read whole: through the stream where calls go out (the same ids,
        and the rest of their arguments as deltas)."""
        if self.streamer is None:
            return tool_calls(whole, self.new_id)
        self.pending += self.streamer.update(whole)
        return self.streamer.calls()

    @property
    def sent_calls(self) -> list[ToolCall] | None:
        """The calls that went out (None: none did): an answer cut short inside them ends with them."""
        return self.streamer.calls() if self.streamer is not None and self.streamer.started else None
