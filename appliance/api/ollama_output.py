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


def _ollama_call(name: str, arguments: str) -> OllamaToolCall | None:
    """A call as Ollama gives it, its arguments an object (None: they are not a whole one yet)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return None
    return OllamaToolCall(OllamaFunctionCall(name, value)) if isinstance(value, dict) else None


class OllamaEvents:
    """The writer for /api/chat (`chat`) and /api/generate. Streamed, each tool call goes out in a
    piece of its own once its arguments are whole, as Ollama's own streams have them (their
    arguments are objects, not text that can be cut); a call cut short is left out."""

    streams_calls = True

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
        self.call_names: list[str] = []  # the calls streamed so far, their arguments as written so far
        self.call_arguments: list[str] = []
        self.calls_sent = 0  # those that went out, whole (in order)

    def start(self, cached_tokens: int = 0) -> list[Event]:
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
        for d in deltas:
            if d.index == len(self.call_names):
                self.call_names.append(d.name or "")
                self.call_arguments.append("")
            self.call_arguments[d.index] += d.arguments
        return self._whole_calls(self.call_names, self.call_arguments)

    def _whole_calls(self, names: list[str], arguments: list[str]) -> list[Event]:
        """A piece for each call after those sent that is whole, in order."""
        out = []
        while self.calls_sent < len(names):
            call = _ollama_call(names[self.calls_sent], arguments[self.calls_sent])
            if call is None:
                break
            out.append(self._answer(None, "", [call], done=False))
            self.calls_sent += 1
        return out

    def finish(self, ending: Ending) -> list[Event]:
        parts = ending.parts
        events = self.push(parts.reasoning or "", parts.content or "", [])
        called = parts.tool_calls or []
        events += self._whole_calls([c.function.name for c in called], [c.function.arguments for c in called])
        calls = [call for c in called if (call := _ollama_call(c.function.name, c.function.arguments)) is not None]
        end = time.monotonic_ns()
        # the prompt's evaluation ended at the first token, whose text may have come later or
        # never (a stop string): else eval_duration could be 0, and clients divide by it
        first = min(max(int(ending.first_token_at * 1e9), self.t0), end) if ending.first_token_at is not None \
            else self.first or end
        done = {"done": True, "done_reason": "length" if parts.finish_reason == "length" else "stop",
                "total_duration": end - self.t0, "load_duration": 0, "prompt_eval_count": ending.prompt_tokens,
                "prompt_eval_duration": first - self.t0, "eval_count": ending.completion_tokens,
                "eval_duration": end - first}
        self.result = self._answer("".join(self.thinking), "".join(self.text), calls, self.logprobs, **done)
        return events + [self._answer(None, "", **done)]

    def failed(self, err: ApiError) -> list[Event]:
        return [{"error": err.message}]
