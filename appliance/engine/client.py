"""The asyncio side of a runner: prompts, token limits, and sequences whose events land in a queue.

Used by the API and by the group executor; raises engine exceptions, never HTTP ones.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from .chat_template import TemplateError
from .runner import Event, Failed, Finished, GenerationRequest, Handle, ModelRunner, PromptScored, TextDelta, TokenLogprob

log = logging.getLogger("eie.client")


class PromptError(ValueError):
    """A prompt that cannot be run; `param` names the request field at fault."""

    def __init__(self, message: str, param: str, code: str | None = None):
        super().__init__(message)
        self.param = param
        self.code = code


class GenerationFailed(Exception):
    def __init__(self, event: Failed):
        super().__init__(event.message)
        self.kind = event.kind


def chat_text(runner: ModelRunner, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
              extra: dict[str, Any] | None = None, continue_final: bool = False) -> str:
    """The text the model's template renders (with `tools`, for a template that lists them itself,
    and the template variables `extra`; `continue_final`: ChatTemplate.render's); PromptError
    where it cannot."""
    try:
        return runner.template.render(messages, tools=tools, extra=extra, continue_final=continue_final)
    except TemplateError as e:
        raise PromptError(f"messages cannot be rendered for model '{runner.name}': {e}", "messages") from e


def render_chat(runner: ModelRunner, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                extra: dict[str, Any] | None = None, continue_final: bool = False) -> list[int]:
    """chat_text, tokenized (blocking: run it off the event loop)."""
    text = chat_text(runner, messages, tools, extra, continue_final)
    vocab = runner.vocab
    if vocab.add_bos and vocab.bos_text and text.startswith(vocab.bos_text):
        text = text[len(vocab.bos_text) :]  # the tokenizer adds BOS itself
    return vocab.tokenize(text, add_special=True, parse_special=True)


def fit_max_tokens(
    n_ctx: int, prompt_len: int, requested: int | None, default: int | None, cap: int | None, param: str,
    max_prompt: int | None = None,
) -> int:
    """max_tokens for one sequence; a prompt that cannot fit is an error, never a crash."""
    if requested is not None and cap is not None and requested > cap:
        raise PromptError(f"max_tokens {requested} exceeds this server's limit of {cap}", "max_tokens")
    if prompt_len == 0:
        raise PromptError("the prompt is empty after tokenization", param)
    if max_prompt is not None and prompt_len > max_prompt:
        raise PromptError(f"the prompt has {prompt_len} tokens; this server's limit is {max_prompt}", param,
                          "prompt_too_long")
    if prompt_len >= n_ctx:
        raise PromptError(
            f"this model's maximum context length is {n_ctx} tokens; the prompt has {prompt_len} tokens",
            param, "context_length_exceeded",
        )
    room = n_ctx - prompt_len
    if requested is not None:
        if requested > room:
            raise PromptError(
                f"this model's maximum context length is {n_ctx} tokens; the prompt has {prompt_len} tokens "
                f"and max_tokens asks for {requested} (at most {room} fit)",
                "max_tokens", "context_length_exceeded",
            )
        return requested
    limit = room if default is None else min(default, room)
    return min(limit, cap) if cap is not None else limit


@dataclass
class Outcome:
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    mean_logprob: float | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprobs: tuple[TokenLogprob, ...] | None = None  # GenerationRequest.prompt_logprobs


# Observers of every sequence's events (metrics, request accounting): tap(gens, index, event,
# first, seconds) where `seconds` is the time since the sequence's previous text (or since submit).
Tap = Callable[["Generations", int, Event, bool, float], None]
_taps: list[Tap] = []


def add_tap(tap: Tap) -> None:
    _taps.append(tap)


def remove_tap(tap: Tap) -> None:
    if tap in _taps:
        _taps.remove(tap)


class Generations:
    """Sequences of one request on one runner; their events merge into one asyncio queue."""

    live: "weakref.WeakSet[Generations]" = weakref.WeakSet()  # started and not yet finished

    def __init__(self, runner: ModelRunner, requests: list[GenerationRequest]):
        self.runner = runner
        self.requests = requests
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.handles: list[Handle] = []
        self._open: set[int] = set(range(len(requests)))  # not yet ended for the reader of events()
        self._ended: set[int] = set()  # ended as the taps saw it (as events arrived)
        self._t0 = time.monotonic()
        self._last: dict[int, float] = {}

    @property
    def pending(self) -> int:
        return len(self._open)

    def start(self) -> None:
        """Submit every sequence; raises QueueFull or NotReady (and then submits none)."""
        loop = asyncio.get_running_loop()
        request = contextvars.copy_context()  # the taps see each event in the request's context

        def make_sink(i: int):
            def sink(ev: Event) -> None:
                try:
                    loop.call_soon_threadsafe(self._arrive, i, ev, context=request)
                except RuntimeError:  # loop already closed at shutdown
                    pass

            return sink

        sinks = [make_sink(i) for i in range(len(self.requests))]
        self._t0 = time.monotonic()
        try:
            self.handles = self.runner.submit_many(self.requests, sinks)
        except Exception:
            self._open.clear()
            raise
        Generations.live.add(self)

    def cancel(self) -> None:
        for h in self.handles:
            h.cancel()

    def abort(self, kind: str, message: str) -> None:
        """End every open sequence now with Failed(kind) (e.g. shutdown at the end of a drain)."""
        for i in sorted(set(range(len(self.requests))) - self._ended):
            self._arrive(i, Failed(kind, message))
        self.cancel()

    def _arrive(self, i: int, ev: Event) -> None:
        """An event of sequence i, on the event loop: the taps see it now, whether or not the
        request still reads its events (one that stopped, its client gone, still has its
        cancelled sequences' ends counted), then it is queued for events()."""
        if i in self._ended:
            return  # already ended (aborted): the runner's own end comes later
        first, seconds = False, 0.0
        if isinstance(ev, TextDelta):
            now = time.monotonic()
            first = i not in self._last
            seconds = now - self._last.get(i, self._t0)
            self._last[i] = now
        elif isinstance(ev, (Finished, Failed)):
            self._ended.add(i)
            if len(self._ended) == len(self.requests):
                Generations.live.discard(self)
        for tap in _taps:
            try:
                tap(self, i, ev, first, seconds)
            except Exception:  # an observer never breaks a request
                log.exception("event tap failed")
        self.queue.put_nowait((i, ev))

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        while self._open:
            i, ev = await self.queue.get()
            if isinstance(ev, (Finished, Failed)):
                self._open.discard(i)
            yield i, ev


class Outcomes:
    """Each sequence's outcome, gathered from its events (collect; a stream that keeps its answer)."""

    def __init__(self, n: int):
        self._outs = [Outcome() for _ in range(n)]
        self._parts: list[list[str]] = [[] for _ in range(n)]

    def add(self, i: int, ev: Event) -> None:
        """One event of sequence i (a failure adds nothing)."""
        if isinstance(ev, TextDelta):
            self._parts[i].append(ev.text)
            self._outs[i].logprobs.extend(ev.logprobs)
        elif isinstance(ev, PromptScored):
            self._outs[i].prompt_logprobs = ev.logprobs
        elif isinstance(ev, Finished):
            o = self._outs[i]
            o.finish_reason, o.prompt_tokens, o.completion_tokens = ev.reason, ev.prompt_tokens, ev.completion_tokens
            o.cached_tokens, o.reasoning_tokens = ev.cached_tokens, ev.reasoning_tokens
            o.accepted_prediction_tokens = ev.accepted_prediction_tokens
            o.rejected_prediction_tokens = ev.rejected_prediction_tokens
            o.mean_logprob = ev.mean_logprob

    def result(self) -> list[Outcome]:
        for o, parts in zip(self._outs, self._parts):
            o.text = "".join(parts)
        return self._outs


async def collect(gens: Generations) -> list[Outcome]:
    """Run to completion; the first failure cancels the rest and raises GenerationFailed."""
    outcomes = Outcomes(len(gens.requests))
    try:
        async for i, ev in gens.events():
            if isinstance(ev, Failed):
                raise GenerationFailed(ev)
            outcomes.add(i, ev)
    finally:
        if gens.pending:
            gens.cancel()
    return outcomes.result()
