"""An Ollama API answer as it is written: one JSON object per piece (`done: false`), then one with
the finish reason, the token counts and the durations (`done: true`), as /api/chat and
/api/generate stream them (the writer answer_relay.relay drives); a whole answer is the pieces
in one object."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone
from typing import Any

from .answer_relay import Ending, Event
from .call_stream import CallDelta
from .errors import ApiError
from .ollama_schemas import (
    OllamaAnswer,
    OllamaError,
    OllamaFunctionCall,
    OllamaReply,
    OllamaToolCall,
)
from .schemas import ChatTokenLogprob, encoder


def now() -> str:
    """The time as Ollama writes it (RFC 3339, UTC)."""
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def error_body(err: ApiError) -> bytes:
    """Ollama's error form, `{"error": "..."}`, with the offending field named as in every EIE error."""
    return encoder.encode(OllamaError(err.message, err.param))


class OllamaEvents:
    """The writer for /api/chat (`chat`) and /api/generate. Tool calls come whole at the end, as
    Ollama's own streams have them (their arguments are objects, not text that can be cut)."""

    streams_calls = False

    def __init__(self, model: str, chat: bool, logprobs: bool):
        self.model = model
        self.chat = chat
        self.with_logprobs = logprobs
        self.t0 = time.monotonic_ns()
        self.first: int | None = None  # when the first piece came: the prompt's evaluation ended
        self.thinking: list[str] = []
        self.text: list[str] = []
        self.logprobs: list[ChatTokenLogprob] = []
        self.result: OllamaAnswer | None = None

    def start(self) -> list[Event]:
        return []

    def _answer(self, thought: str | None, text: str, calls: list[OllamaToolCall] | None = None,
                logprobs: list[ChatTokenLogprob] | None = None, **done: Any) -> OllamaAnswer:
        lp = logprobs if self.with_logprobs and logprobs is not None else None
        if self.chat:
            message = OllamaReply("assistant", text, thinking=thought or None, tool_calls=calls or None)
            return OllamaAnswer(model=self.model, created_at=now(), message=message, logprobs=lp, **done)
        return OllamaAnswer(model=self.model, created_at=now(), response=text, thinking=thought or None, logprobs=lp,
                            **done)

    def push(self, thought: str, text: str, logprobs: list[ChatTokenLogprob]) -> list[Event]:
        if self.first is None:
            self.first = time.monotonic_ns()
        self.thinking.append(thought)
        self.text.append(text)
        self.logprobs += logprobs
        if not (thought or text or (logprobs and self.with_logprobs)):
            return []
        return [self._answer(thought, text, logprobs=logprobs, done=False)]

    def calls(self, deltas: list[CallDelta]) -> list[Event]:
        return []

    def finish(self, ending: Ending) -> list[Event]:
        parts = ending.parts
        events = self.push(parts.reasoning or "", parts.content or "", [])
        calls = [OllamaToolCall(OllamaFunctionCall(c.function.name, json.loads(c.function.arguments)))
                 for c in parts.tool_calls or []]
        if calls:
            events.append(self._answer(None, "", calls, done=False))
        end = time.monotonic_ns()
        first = self.first or end
        done = {"done": True, "done_reason": "length" if parts.finish_reason == "length" else "stop",
                "total_duration": end - self.t0, "load_duration": 0, "prompt_eval_count": ending.prompt_tokens,
                "prompt_eval_duration": first - self.t0, "eval_count": ending.completion_tokens,
                "eval_duration": end - first}
        self.result = self._answer("".join(self.thinking), "".join(self.text), calls, self.logprobs, **done)
        return events + [self._answer(None, "", **done)]

    def failed(self, err: ApiError) -> list[Event]:
        return [{"error": err.message}]
