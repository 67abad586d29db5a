"""A chat answer's text read into the message's parts: the reasoning (engine/reasoning.py),
the content and the tool calls (api/tools.py, api/native_tools.py), whole or as it streams."""

from __future__ import annotations

from dataclasses import dataclass

from ..engine import reasoning
from .call_stream import CallDelta
from .schemas import ToolCall
from .tools import ToolPlan


@dataclass(frozen=True)
class Parts:
    reasoning: str | None
    content: str | None
    tool_calls: list[ToolCall] | None
    finish_reason: str


@dataclass(frozen=True)
class AnswerShape:
    tools: ToolPlan | None = None
    think: reasoning.Tags | None = None  # the block's tags, where the request wants it apart
    inside: bool = False  # the prompt opened the block: the answer starts in it

    @property
    def plain(self) -> bool:
        return self.tools is None and self.think is None

    def whole(self, text: str, finish_reason: str) -> Parts:
        thought = None
        if self.think:
            thought, text = reasoning.split(text, self.inside, self.think)
        if self.tools is None:
            return Parts(thought, text, None, finish_reason)
        content, calls, reason = self.tools.read(text, finish_reason)
        return Parts(thought, content, calls, reason)

    def reader(self, stream_calls: bool = False) -> "AnswerReader":
        """A reader of the answer as it streams (`stream_calls`: tool calls go out as they are
        written, api/call_stream.py)."""
        return AnswerReader(self, stream_calls)


class AnswerReader:
    """`AnswerShape.whole` as the text streams: push pieces, get (reasoning, content) deltas, and
    with `stream_calls` the tool calls' deltas from `take_calls`; the tool calls, and what was
    held back, come with `finish`."""

    def __init__(self, shape: AnswerShape, stream_calls: bool = False) -> None:
        self.splitter = reasoning.Splitter(shape.inside, shape.think) if shape.think else None
        self.tools = shape.tools.reader(stream_calls) if shape.tools is not None else None

    def push(self, piece: str) -> tuple[str, str]:
        thought, text = self.splitter.push(piece) if self.splitter else ("", piece)
        return thought, (self.tools.push(text) if self.tools and text else text)

    def take_calls(self) -> list[CallDelta]:
        """What the tool calls gained since last asked (with `stream_calls`)."""
        return self.tools.take_calls() if self.tools is not None else []

    def finish(self, finish_reason: str) -> Parts:
        thought, text = self.splitter.finish() if self.splitter else ("", "")
        if self.tools is None:
            return Parts(thought or None, text or None, None, finish_reason)
        if text:
            text = self.tools.push(text)
        content, calls, reason = self.tools.finish(finish_reason)
        return Parts(thought or None, (text + (content or "")) or None, calls, reason)
