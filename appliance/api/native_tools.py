"""Tool calls in a model's own format, where its chat template has one.

The Hermes format is the one covered: the template lists the tools itself (its `tools` variable)
and the model answers `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`, after text
of its own or none. Qwen 2.5 and 3, Hermes 2 Pro and 3, and many fine-tunes of them write it, with
`<tool_call>` as one token of their vocabulary. That token starts the grammar: under `auto` the
answer is free until the model picks it (a lazy grammar, engine/grammar.py), under `required` or a
named function the answer begins with it. A template that names the tag without the vocabulary
having it as one token is served in EIE's own format (api/tools.py).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from ..engine.chat_template import ChatTemplate
from ..engine.native import Vocab
from ..engine.text import partial_suffix
from .schemas import ChatMessage, ChatRequest, FunctionCall, ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.DOTALL)
_ROOT = re.compile(r"^root ::= ", re.MULTILINE)


@dataclass(frozen=True)
class NativeFormat:
    name: str  # "hermes"
    open_token: int  # the vocabulary's `<tool_call>`


def detect(template_source: str, vocab: Vocab) -> NativeFormat | None:
    """The model's own tool-call format, when its template renders tools in one this server reads."""
    if OPEN not in template_source or CLOSE not in template_source or "tools" not in template_source:
        return None
    ids = vocab.tokenize(OPEN, add_special=False, parse_special=True)
    return NativeFormat("hermes", ids[0]) if len(ids) == 1 else None


def format_of(template: ChatTemplate, vocab: Vocab) -> NativeFormat | None:
    """`detect` for a loaded model (its template and vocabulary)."""
    return detect(template.source, vocab)


def grammar(call_gbnf: str, parallel: bool) -> str:
    """The answer's grammar from that of one call's JSON object (start symbol `root`): one tagged
    call, or several on their own lines when `parallel`."""
    calls = _ROOT.sub("call ::= ", call_gbnf, count=1)
    more = ' ("\\n" tagged-call)*' if parallel else ""
    return (f"root ::= tagged-call{more}\n"
            f'tagged-call ::= "{OPEN}" "\\n"? call "\\n"? "{CLOSE}"\n' + calls)


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


def conversation(messages: list[dict[str, str]], raw: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages for a template that renders tool turns itself: an assistant's calls as
    `tool_calls` with their arguments as objects (templates write them with `tojson`), tool
    results as `tool` messages."""
    out: list[dict[str, Any]] = []
    for msg, plain in zip(raw, messages):
        if msg.role == "assistant" and msg.tool_calls:
            calls = [{"id": c.id or f"call_{k}", "type": "function",
                      "function": {"name": c.function.name, "arguments": arguments_value(c.function.arguments)}}
                     for k, c in enumerate(msg.tool_calls)]
            out.append({"role": "assistant", "content": plain["content"], "tool_calls": calls})
        elif msg.role == "tool":
            out.append({"role": "tool", "content": plain["content"],
                        **({"tool_call_id": msg.tool_call_id} if msg.tool_call_id else {}),
                        **({"name": msg.name} if msg.name else {})})
        else:
            out.append(plain)
    return out


def arguments_value(text: str) -> Any:
    """A call's arguments (JSON text, as OpenAI sends them) as the value they encode; text that
    is not JSON as it is."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def read_answer(text: str, finish_reason: str) -> tuple[str | None, list[ToolCall] | None, str]:
    """(content, tool_calls, finish_reason) from an answer in the Hermes format. Text before the
    first call is the content; an answer cut short (max_tokens, a stop string) inside its calls is
    its text as it is."""
    start = text.find(OPEN)
    if start < 0:
        return text, None, finish_reason
    if finish_reason != "stop":
        return text, None, finish_reason
    calls = []
    for block in _CALL.finditer(text, start):
        try:
            obj = json.loads(block.group(1))
            calls.append(ToolCall(id=f"call_{uuid.uuid4().hex[:24]}",
                                  function=FunctionCall(obj["name"], json.dumps(obj["arguments"], ensure_ascii=False))))
        except (ValueError, KeyError, TypeError):
            return text, None, finish_reason
    if not calls:
        return text, None, finish_reason
    return text[:start].rstrip() or None, calls, "tool_calls"


class AnswerReader:
    """Reads a Hermes-format answer as it streams: text before the first `<tool_call>` goes out as
    it comes (a tail that may be the tag's beginning waits for the next piece); the calls are read
    whole at the end."""

    def __init__(self) -> None:
        self.text = ""
        self.sent = 0

    def push(self, piece: str) -> str:
        self.text += piece
        start = self.text.find(OPEN)
        end = start if start >= 0 else len(self.text) - partial_suffix(self.text, [OPEN])
        end = len(self.text[:end].rstrip())  # blanks before a call are not content
        new = self.text[self.sent:end] if end > self.sent else ""
        self.sent += len(new)
        return new

    def finish(self, finish_reason: str) -> tuple[str | None, list[ToolCall] | None, str]:
        content, calls, reason = read_answer(self.text, finish_reason)
        if content is not None:
            content = content[self.sent:]
        return content, calls, reason
