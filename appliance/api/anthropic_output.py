"""An Anthropic Messages API answer as it is written: its content blocks (thinking, text,
tool_use) and the stream events that announce them, in the order Anthropic's streams have them
(the writer answer_relay.relay drives)."""

from __future__ import annotations

import json
import uuid
from typing import Any

from .answer_relay import Ending, Event
from .anthropic_schemas import (
    AnthropicErrorBody,
    AnthropicErrorEnvelope,
    AnthropicMessage,
    AnthropicUsage,
    ContentBlock,
    TextBlock,
    ThinkingBlock,
    ToolUseBlock,
)
from .call_stream import CallDelta
from .errors import ApiError
from .schemas import ChatTokenLogprob, encoder

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
               504: "timeout_error"}


def error_type(status: int) -> str:
    """Anthropic's error type for an HTTP status."""
    return ERROR_TYPES.get(status, "invalid_request_error" if 400 <= status < 500 else "api_error")


def _error(err: ApiError) -> AnthropicErrorBody:
    return AnthropicErrorBody(error_type(err.status), err.message, err.param)


def error_body(err: ApiError) -> bytes:
    """Anthropic's error envelope, with the offending field named as in every EIE error."""
    return encoder.encode(AnthropicErrorEnvelope(_error(err)))


def stop_reason(ending: Ending) -> str:
    reason = ending.parts.finish_reason
    if reason == "tool_calls":
        return "tool_use"
    if reason == "length":
        return "max_tokens"
    return "stop_sequence" if ending.stop_string is not None else "end_turn"


class MessageEvents:
    """The Messages API's writer for answer_relay.relay: a tool call's block opens once its name is
    known, and its input streams as `input_json_delta` pieces."""

    streams_calls = True

    def __init__(self, model: str, prompt_tokens: int):
        self.id = f"msg_{uuid.uuid4().hex}"
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.blocks: list[ContentBlock] = []
        self.open: str | None = None  # thinking | text | tool_use: the block being written
        self.text: list[str] = []
        self.tool: ToolUseBlock | None = None  # the tool_use block being written (its input: {})
        self.tool_blocks: dict[str, ToolUseBlock] = {}  # by the call's id
        self.result: AnthropicMessage | None = None

    def start(self, cached_tokens: int = 0) -> list[Event]:
        """message_start, its usage split as the end's is: the prompt tokens prefilled, and those
        restored from the prefix cache (known once the first text is out)."""
        message = AnthropicMessage(id=self.id, model=self.model, content=[], stop_reason=None,
                                   usage=AnthropicUsage(self.prompt_tokens - cached_tokens, 0,
                                                        cache_read_input_tokens=cached_tokens))
        return [{"type": "message_start", "message": message}]

    def push(self, thought: str, text: str, logprobs: list[ChatTokenLogprob]) -> list[Event]:
        return (self._write("thinking", thought) if thought else []) + (self._write("text", text) if text else [])

    def _write(self, kind: str, piece: str) -> list[Event]:
        events: list[Event] = []
        if self.open is not None and self.open != kind:
            events += self._close()
        index = len(self.blocks)
        if self.open is None:
            self.open = kind
            block = ThinkingBlock("") if kind == "thinking" else TextBlock("")
            events.append({"type": "content_block_start", "index": index, "content_block": block})
        self.text.append(piece)
        delta = {"type": "thinking_delta", "thinking": piece} if kind == "thinking" else {"type": "text_delta",
                                                                                          "text": piece}
        return events + [{"type": "content_block_delta", "index": index, "delta": delta}]

    def calls(self, deltas: list[CallDelta]) -> list[Event]:
        """Tool calls as they are written: a block for each, its input in pieces of JSON text."""
        events: list[Event] = []
        for d in deltas:
            if d.id is not None:
                if self.open is not None:
                    events += self._close()
                self.open, self.tool = "tool_use", ToolUseBlock(f"toolu_{uuid.uuid4().hex[:24]}", d.name or "", {})
                self.tool_blocks[d.id] = self.tool
                events.append({"type": "content_block_start", "index": len(self.blocks), "content_block": self.tool})
            if d.arguments:
                self.text.append(d.arguments)
                events.append({"type": "content_block_delta", "index": len(self.blocks),
                               "delta": {"type": "input_json_delta", "partial_json": d.arguments}})
        return events

    def _close(self) -> list[Event]:
        text = "".join(self.text)
        if self.open == "tool_use":
            self.blocks.append(ToolUseBlock(self.tool.id, self.tool.name, _input(text)))
        else:
            self.blocks.append(ThinkingBlock(text) if self.open == "thinking" else TextBlock(text))
        self.open, self.text, self.tool = None, [], None
        return [{"type": "content_block_stop", "index": len(self.blocks) - 1}]

    def finish(self, ending: Ending) -> list[Event]:
        parts = ending.parts
        events = self.push(parts.reasoning or "", parts.content or "", [])
        if self.open is not None:
            events += self._close()
        for call in parts.tool_calls or []:
            if call.id in self.tool_blocks:  # it went out as it was written
                continue
            events += self.calls([CallDelta(0, call.id, call.function.name, call.function.arguments)]) + self._close()
        usage = AnthropicUsage(ending.prompt_tokens - ending.cached_tokens, ending.completion_tokens,
                               cache_read_input_tokens=ending.cached_tokens)
        reason = stop_reason(ending)
        self.result = AnthropicMessage(id=self.id, model=self.model, content=list(self.blocks), stop_reason=reason,
                                       stop_sequence=ending.stop_string if reason == "stop_sequence" else None,
                                       usage=usage)
        return events + [{"type": "message_delta", "delta": {"stop_reason": reason,
                                                             "stop_sequence": self.result.stop_sequence},
                          "usage": usage},
                         {"type": "message_stop"}]

    def failed(self, err: ApiError) -> list[Event]:
        return [{"type": "error", "error": _error(err)}]


def _input(arguments: str) -> Any:
    """A tool_use block's input from its call's arguments; a call cut short, whose JSON text does
    not read, has an empty input (its stream had the text as far as it went)."""
    try:
        return json.loads(arguments)
    except ValueError:
        return {}
