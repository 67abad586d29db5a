"""A Responses API answer as it is written: its output items (reasoning, message, function
calls) and the stream events that announce them, in the order OpenAI's streams have them
(the writer answer_relay.relay drives)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from msgspec.structs import replace

from .answer_relay import Ending, Event
from .call_stream import CallDelta
from .errors import ApiError
from .responses_input import new_id
from .responses_schemas import (
    FunctionCallItem,
    IncompleteDetails,
    InputTokensDetails,
    MessageItem,
    OutputItem,
    OutputText,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningText,
    Response,
    ResponseError,
    ResponseUsage,
)
from .schemas import ChatTokenLogprob


@dataclass
class _Open:
    """The item being written: a reasoning item or a message."""

    kind: str  # reasoning | message
    id: str
    index: int  # its place in the output
    text: list[str] = field(default_factory=list)
    logprobs: list[ChatTokenLogprob] = field(default_factory=list)


@dataclass
class _Call:
    """A function call item being written: its place in the output and its arguments so far."""

    item: FunctionCallItem
    index: int
    arguments: list[str] = field(default_factory=list)


class ResponseEvents:
    """The Responses API's writer for answer_relay.relay: a function call's item opens once its
    name is known, and its arguments stream as `function_call_arguments.delta` events."""

    streams_calls = True

    def __init__(self, base: Response, logprobs: bool, keep: Callable[[Response], None],
                 on_event: Callable[[Event], None] | None = None):
        self.base = base  # the response as created: status in_progress, no output
        self.with_logprobs = logprobs
        self.keep = keep
        self.on_event = on_event  # sees every event made (a streamed background response's log)
        self.announced = False  # `queued` sent the created event already
        self.started = False  # the answer's events have begun (`start`)
        self.result: Response | None = None
        self.error: ApiError | None = None  # the failure `failed` said
        self.items: list[OutputItem] = []
        self.open: _Open | None = None
        self.pending: list[ChatTokenLogprob] = []  # token logprobs whose text is held back
        self.sequence = 0
        self.calling: dict[str, _Call] = {}  # the function calls that went out, by call id

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        if self.on_event is not None:
            self.on_event(event)
        return event

    def queued(self, response: Response) -> list[Event]:
        """A background response's first events, sent before its work starts."""
        self.announced = True
        return [self._event("response.created", response=response),
                self._event("response.queued", response=response)]

    def start(self, cached_tokens: int = 0) -> list[Event]:
        self.started = True
        created = [] if self.announced else [self._event("response.created", response=self.base)]
        return created + [self._event("response.in_progress", response=self.base)]

    def push(self, thought: str, text: str, logprobs: list[ChatTokenLogprob]) -> list[Event]:
        """A piece of the answer: reasoning, then text (either may be empty), and the logprobs of
        the tokens it came from (the reasoning's are not kept: they belong to no output text)."""
        events: list[Event] = []
        self.pending.extend(logprobs)
        if thought:
            events += self._write("reasoning", thought)
            if not text:
                self.pending.clear()
        if text:
            events += self._write("message", text)
        return events

    def _write(self, kind: str, text: str) -> list[Event]:
        events: list[Event] = []
        if self.open is not None and self.open.kind != kind:
            events += self._close("completed")
        if self.open is None:
            events += self._open(kind)
        item = self.open
        item.text.append(text)
        where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        if kind == "reasoning":
            return events + [self._event("response.reasoning_text.delta", **where, delta=text)]
        taken, self.pending = self.pending, []
        item.logprobs.extend(taken)
        return events + [self._event("response.output_text.delta", **where, delta=text,
                                     logprobs=taken if self.with_logprobs else [])]

    def _open(self, kind: str) -> list[Event]:
        index = len(self.items)
        if kind == "reasoning":
            self.open = _Open(kind, new_id("rs"), index)
            item: OutputItem = ReasoningItem(id=self.open.id, status="in_progress")
            part: Any = ReasoningText("")
        else:
            self.open = _Open(kind, new_id("msg"), index)
            item = MessageItem(id=self.open.id, status="in_progress")
            part = OutputText("")
        return [self._event("response.output_item.added", output_index=index, item=item),
                self._event("response.content_part.added", item_id=self.open.id, output_index=index,
                            content_index=0, part=part)]

    def _close(self, status: str) -> list[Event]:
        item, self.open = self.open, None
        text = "".join(item.text)
        where = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        if item.kind == "reasoning":
            part: Any = ReasoningText(text)
            done: OutputItem = ReasoningItem(id=item.id, content=[part])
            events = [self._event("response.reasoning_text.done", **where, text=text)]
        else:
            item.logprobs.extend(self.pending)
            self.pending = []
            logprobs = item.logprobs if self.with_logprobs else []
            part = OutputText(text, logprobs=logprobs)
            done = MessageItem(id=item.id, status=status, content=[part])
            events = [self._event("response.output_text.done", **where, text=text, logprobs=logprobs)]
        self.items.append(done)
        return events + [self._event("response.content_part.done", **where, part=part),
                         self._event("response.output_item.done", output_index=item.index, item=done)]

    def finish(self, ending: Ending) -> list[Event]:
        """The rest of the answer (what was held back) and its tool calls: every item closes, and
        the response is complete (`result`, stored by `keep` before the client hears of it). An
        answer with no text and no calls still has its (empty) message."""
        parts = ending.parts
        events = self.push(parts.reasoning or "", parts.content or "", [])
        incomplete = parts.finish_reason == "length"
        if self.open is None and not parts.tool_calls and not any(isinstance(i, MessageItem) for i in self.items):
            events += self._open("message")
        if self.open is not None:
            events += self._close("incomplete" if incomplete else "completed")
        for call in parts.tool_calls or []:
            if call.id not in self.calling:
                events += self.calls([CallDelta(0, call.id, call.function.name, call.function.arguments)])
            events += self._call_done(self.calling[call.id], "incomplete" if incomplete else "completed")
        usage = ResponseUsage(ending.prompt_tokens, InputTokensDetails(ending.cached_tokens), ending.completion_tokens,
                              OutputTokensDetails(ending.reasoning_tokens),
                              ending.prompt_tokens + ending.completion_tokens)
        self.result = replace(self.base, status="incomplete" if incomplete else "completed",
                              completed_at=int(time.time()), output=list(self.items), usage=usage,
                              incomplete_details=IncompleteDetails("max_output_tokens") if incomplete else None)
        self.keep(self.result)
        return events + [self._event(f"response.{self.result.status}", response=self.result)]

    def calls(self, deltas: list[CallDelta]) -> list[Event]:
        """Function calls as they are written: an item for each, its arguments in pieces."""
        events: list[Event] = []
        for d in deltas:
            if d.id is not None:
                if self.open is not None:
                    events += self._close("completed")
                item = FunctionCallItem(id=new_id("fc"), call_id=d.id, name=d.name or "", arguments="",
                                        status="in_progress")
                call = self.calling[d.id] = _Call(item, len(self.items))
                self.items.append(item)  # its place; the whole item replaces it when it is done
                events.append(self._event("response.output_item.added", output_index=call.index, item=item))
            else:
                call = list(self.calling.values())[d.index]
            if d.arguments:
                call.arguments.append(d.arguments)
                events.append(self._event("response.function_call_arguments.delta", item_id=call.item.id,
                                          output_index=call.index, delta=d.arguments))
        return events

    def _call_done(self, call: _Call, status: str) -> list[Event]:
        done = replace(call.item, arguments="".join(call.arguments), status=status)
        self.items[call.index] = done
        return [self._event("response.function_call_arguments.done", item_id=done.id, output_index=call.index,
                            name=done.name, arguments=done.arguments),
                self._event("response.output_item.done", output_index=call.index, item=done)]

    def failed(self, err: ApiError) -> list[Event]:
        self.error = err
        response = replace(self.base, status="failed", output=list(self.items),
                           error=ResponseError(err.code or err.type, err.message))
        return [self._event("response.failed", response=response)]
