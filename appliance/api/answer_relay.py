"""A chat-shaped answer relayed as it is generated: its pieces read into reasoning, text and tool
calls (chat_answer.py) and handed to an API's writer (the Responses API's output items, the
Anthropic Messages API's content blocks), which makes them stream events and, at the end, the
whole answer. A whole answer is built by the same calls with the events left unsent, so the
streamed and the whole answer to one request have the same parts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ..config import Config
from ..engine.client import Generations, fit_max_tokens
from ..engine.runner import Failed, Finished, GenerationRequest, ModelRunner, TextDelta
from ..engine.sampling import SamplingParams
from .call_stream import CallDelta
from .chat_answer import AnswerShape, Parts
from .errors import ApiError
from .generation import deadline, failure_error, serve, stop_list
from .http import EventStream, Request
from .openai_routes import chat_logprobs
from .schemas import ChatRequest, ChatTokenLogprob, encoder

Event = dict[str, Any]  # {"type": ..., ...}


@dataclass(frozen=True)
class Ending:
    parts: Parts  # what was held back until the end, the tool calls, and the finish reason
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    reasoning_tokens: int  # generated inside the think block (runner.Finished)
    stop_string: str | None  # the request's stop string that ended it
    first_token_at: float | None = None  # time.monotonic() of its first token (runner.Finished)


class AnswerWriter(Protocol):
    result: Any  # the whole answer, once finish has run
    streams_calls: bool  # tool calls go out as they are written (`calls`), else whole with `finish`

    def start(self, cached_tokens: int = 0) -> list[Event]: ...  # the prompt's tokens restored from the cache

    def push(self, thought: str, text: str, logprobs: list[ChatTokenLogprob]) -> list[Event]: ...

    def calls(self, deltas: list[CallDelta]) -> list[Event]: ...

    def finish(self, ending: Ending) -> list[Event]: ...

    def failed(self, err: ApiError) -> list[Event]: ...


def named_event(event: Event) -> bytes:
    """A server-sent event named by its type (the Responses and Messages APIs' streams)."""
    return b"event: " + event["type"].encode() + b"\ndata: " + encoder.encode(event) + b"\n\n"


def json_line(event: Event) -> bytes:
    """One line of newline-delimited JSON (Ollama's streams)."""
    return encoder.encode(event) + b"\n"


NDJSON = b"application/x-ndjson"


async def relay(request: Request, gens: Generations, shape: AnswerShape, writer: AnswerWriter, stream: bool,
                framing: Callable[[Event], bytes] = named_event,
                content_type: bytes = b"text/event-stream") -> None:
    """Stream `writer`'s events (`framing` makes each one bytes), or answer its whole result. A
    failure before the first token keeps its HTTP status; after it, the writer says it in-band."""
    sse = EventStream(request, content_type=content_type) if stream else None
    # a writer that streams calls reads a whole answer as its stream would (an answer cut short
    # inside its calls ends with them, not with their JSON as text)
    reader = None if shape.plain else shape.reader(writer.streams_calls)
    started = False

    async def send(events: list[Event]) -> None:
        if sse is not None:
            for event in events:
                await sse.raw(framing(event))

    try:
        async for _, ev in gens.events():
            if not started:
                if isinstance(ev, Failed) and (sse is None or not sse.started):
                    raise failure_error(ev)  # (a keep-alive starts the response: then in-band)
                started = True
                await send(writer.start(ev.cached_tokens if isinstance(ev, (TextDelta, Finished)) else 0))
            if isinstance(ev, TextDelta):
                thought, text = reader.push(ev.text) if reader else ("", ev.text)
                logprobs = chat_logprobs(ev.logprobs).content if ev.logprobs else []
                await send(writer.push(thought, text, logprobs) + (writer.calls(reader.take_calls()) if reader else []))
            elif isinstance(ev, Finished):
                parts = reader.finish(ev.reason) if reader else Parts(None, None, None, ev.reason)
                if reader:
                    await send(writer.calls(reader.take_calls()))
                await send(writer.finish(Ending(parts, ev.prompt_tokens, ev.cached_tokens, ev.completion_tokens,
                                                ev.reasoning_tokens, ev.stop_string, ev.first_token_at)))
            elif isinstance(ev, Failed):
                err = failure_error(ev)
                if sse is None:
                    raise err
                await send(writer.failed(err))
                gens.cancel()
                break
        if sse is not None:
            await sse.close()
        elif writer.result is not None:
            await request.json(200, writer.result)
    except OSError:  # the client went away mid-stream
        gens.cancel()


def chat_max_tokens(config: Config, runner: ModelRunner, chat: ChatRequest, prompt: list[int],
                    prompt_param: str) -> int:
    """The tokens `chat`'s answer may have after `prompt`; a 400 naming `prompt_param` (or the
    max tokens field) where they do not fit the context or the server's limits."""
    limits = config.server.limits
    return fit_max_tokens(runner.n_ctx, len(prompt), chat.max_completion_tokens, None, limits.max_tokens,
                          prompt_param, limits.max_prompt_tokens)


async def relay_chat(request: Request, config: Config, runner: ModelRunner, chat: ChatRequest, prompt: list[int],
                     params: SamplingParams, shape: AnswerShape, writer: AnswerWriter, stream: bool,
                     prompt_param: str, framing: Callable[[Event], bytes] = named_event,
                     content_type: bytes = b"text/event-stream") -> None:
    """Generate the answer to `chat` (its prompt, sampling and shape from chat_answer_plan) and
    relay it through `writer`: the sequence the chat route would run, within the server's limits
    (`prompt_param`: the field a prompt that does not fit is named by)."""
    max_tokens = chat_max_tokens(config, runner, chat, prompt, prompt_param)
    top = (chat.top_logprobs or 0) if chat.logprobs else None
    gens = Generations(runner, [GenerationRequest(prompt, max_tokens, params, stop_list(chat), deadline(config),
                                                  top_logprobs=top, speculative=chat.speculative)])
    await serve(request, gens, lambda: relay(request, gens, shape, writer, stream, framing,
                                             content_type))


async def relay_whole(request: Request, writer: AnswerWriter, thought: str | None, text: str, ending: Ending,
                      stream: bool, framing: Callable[[Event], bytes] = named_event,
                      content_type: bytes = b"text/event-stream", sse: EventStream | None = None) -> None:
    """An answer that is whole already (a group's: api/group_chat.py) through `writer`, streamed
    as relay streams one (in one go; `sse`: the stream opened while it was made) or answered whole."""
    events = writer.start(ending.cached_tokens) + writer.push(thought or "", text, []) + writer.finish(ending)
    if not stream:
        await request.json(200, writer.result)
        return
    sse = sse or EventStream(request, content_type=content_type)
    try:
        for event in events:
            await sse.raw(framing(event))
        await sse.close()
    except OSError:  # the client went away
        pass


async def relay_failure(sse: EventStream, writer: AnswerWriter, err: ApiError,
                        framing: Callable[[Event], bytes] = named_event) -> None:
    """A failure on a stream that a keep-alive started before the answer did: the writer's start
    and its in-band error."""
    try:
        for event in writer.start() + writer.failed(err):
            await sse.raw(framing(event))
        await sse.close()
    except OSError:  # the client went away
        pass
