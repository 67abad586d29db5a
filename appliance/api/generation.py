"""From an API request to engine sequences and back: prompts, limits, sampling, the async bridge."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import AsyncIterator

from ..config import Config
from ..engine.chat_template import TemplateError
from ..engine.runner import (
    Event,
    Failed,
    Finished,
    GenerationRequest,
    Handle,
    ModelRunner,
    NotReady,
    QueueFull,
    TextDelta,
)
from ..engine.sampling import SamplingParams
from .errors import ApiError, bad_request
from .schemas import ChatMessage, ChatRequest, CompletionRequest, SamplingFields

RETRY_AFTER = [(b"retry-after", b"1")]


def resolve_runner(runners: dict[str, ModelRunner], name: str) -> ModelRunner:
    runner = runners.get(name)
    if runner is None:
        raise ApiError(404, f"model '{name}' does not exist", param="model", code="model_not_found")
    if runner.state == "loading":
        raise ApiError(
            503, f"model '{name}' is still loading", type="service_unavailable", param="model",
            code="model_not_ready", headers=RETRY_AFTER,
        )
    if runner.state != "ready":
        raise ApiError(
            503, f"model '{name}' is not available: {runner.error or runner.state}", type="service_unavailable",
            param="model", code="model_not_ready",
        )
    return runner


def sampling_params(req: SamplingFields, n_vocab: int) -> SamplingParams:
    if req.logprobs:
        raise bad_request("logprobs are not supported by this server yet", param="logprobs")
    bias: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        try:
            tok = int(key)
        except ValueError:
            raise bad_request(f"logit_bias key {key!r} is not a token id", param="logit_bias") from None
        if not 0 <= tok < n_vocab:
            raise bad_request(f"logit_bias token id {tok} is outside the vocabulary (0..{n_vocab - 1})", param="logit_bias")
        bias[tok] = value
    return SamplingParams(
        temperature=req.temperature,
        top_k=req.top_k,
        top_p=req.top_p,
        min_p=req.min_p,
        repeat_penalty=req.repeat_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        seed=None if req.seed is None else req.seed & 0xFFFFFFFF,
        logit_bias=bias,
    )


def choice_params(params: SamplingParams, index: int) -> SamplingParams:
    """The n choices of one request differ: choice i draws with seed + i."""
    if index == 0 or params.seed is None:
        return params
    return replace(params, seed=(params.seed + index) & 0xFFFFFFFF)


def stop_list(req: SamplingFields) -> list[str]:
    if req.stop is None:
        return []
    return [req.stop] if isinstance(req.stop, str) else list(req.stop)


def _message_text(msg: ChatMessage, index: int) -> str:
    if msg.content is None:
        return ""
    if isinstance(msg.content, str):
        return msg.content
    parts = []
    for j, part in enumerate(msg.content):
        if part.type != "text" or part.text is None:
            raise bad_request(
                f"content part type {part.type!r} is not supported (text only)",
                param=f"messages[{index}].content[{j}].type",
            )
        parts.append(part.text)
    return "".join(parts)


def chat_messages(req: ChatRequest) -> list[dict[str, str]]:
    if req.tools:
        raise bad_request("tools are not supported by this server yet", param="tools")
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request("only response_format type 'text' is supported", param="response_format")
    out = []
    for i, m in enumerate(req.messages):
        role = "system" if m.role == "developer" else m.role
        out.append({"role": role, "content": _message_text(m, i)})
    return out


def render_chat(runner: ModelRunner, messages: list[dict[str, str]]) -> list[int]:
    """Render with the model's template and tokenize (blocking: run it off the event loop)."""
    try:
        text = runner.template.render(messages)
    except TemplateError as e:
        raise bad_request(f"messages cannot be rendered for model '{runner.name}': {e}", param="messages") from e
    vocab = runner.vocab
    if vocab.add_bos and vocab.bos_text and text.startswith(vocab.bos_text):
        text = text[len(vocab.bos_text) :]  # the tokenizer adds BOS itself
    return vocab.tokenize(text, add_special=True, parse_special=True)


def completion_prompts(runner: ModelRunner, req: CompletionRequest) -> list[list[int]]:
    """Token lists for each prompt (blocking: run it off the event loop)."""
    if req.suffix:
        raise bad_request("suffix is not supported", param="suffix")
    if req.echo:
        raise bad_request("echo is not supported", param="echo")
    p = req.prompt
    vocab = runner.vocab
    if isinstance(p, str):
        return [vocab.tokenize(p, add_special=True, parse_special=False)]
    if not p:
        raise bad_request("prompt must not be empty", param="prompt")
    if all(isinstance(x, int) and not isinstance(x, bool) for x in p):
        for x in p:
            if not 0 <= x < vocab.n_vocab:
                raise bad_request(f"token id {x} is outside the vocabulary (0..{vocab.n_vocab - 1})", param="prompt")
        return [list(p)]  # type: ignore[arg-type]
    if all(isinstance(x, str) for x in p):
        if len(p) > 16:
            raise bad_request("at most 16 prompts per request", param="prompt")
        return [vocab.tokenize(x, add_special=True, parse_special=False) for x in p]  # type: ignore[arg-type]
    raise bad_request("prompt must be a string, a list of strings or a list of token ids", param="prompt")


def generation_limits(
    config: Config, runner: ModelRunner, prompt: list[int], requested: int | None, default: int | None, param: str
) -> int:
    """max_tokens for one sequence; a prompt that cannot fit is a 400, never a crash."""
    n_ctx = runner.n_ctx
    cap = config.server.limits.max_tokens
    if requested is not None and cap is not None and requested > cap:
        raise bad_request(f"max_tokens {requested} exceeds this server's limit of {cap}", param="max_tokens")
    if not prompt:
        raise bad_request("the prompt is empty after tokenization", param=param)
    if len(prompt) >= n_ctx:
        raise bad_request(
            f"this model's maximum context length is {n_ctx} tokens; the prompt has {len(prompt)} tokens",
            param=param, code="context_length_exceeded",
        )
    room = n_ctx - len(prompt)
    if requested is not None:
        if requested > room:
            raise bad_request(
                f"this model's maximum context length is {n_ctx} tokens; the prompt has {len(prompt)} tokens "
                f"and max_tokens asks for {requested} (at most {room} fit)",
                param="max_tokens", code="context_length_exceeded",
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


class Generations:
    """Several sequences of one request running on one runner; events merge into one queue."""

    def __init__(self, runner: ModelRunner, requests: list[GenerationRequest]):
        self.runner = runner
        self.requests = requests
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.handles: list[Handle] = []
        self.pending = len(requests)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        queue = self.queue

        def make_sink(i: int):
            def sink(ev: Event) -> None:
                try:
                    loop.call_soon_threadsafe(queue.put_nowait, (i, ev))
                except RuntimeError:  # loop already closed at shutdown
                    pass

            return sink

        try:
            for i, req in enumerate(self.requests):
                self.handles.append(self.runner.submit(req, make_sink(i)))
        except QueueFull:
            self.cancel()
            raise ApiError(
                429, f"model '{self.runner.name}' has too many requests queued; retry later",
                type="rate_limit_error", code="queue_full", headers=RETRY_AFTER,
            ) from None
        except NotReady as e:
            self.cancel()
            raise ApiError(503, f"model '{self.runner.name}' is not ready: {e}", type="service_unavailable",
                           code="model_not_ready") from None

    def cancel(self) -> None:
        for h in self.handles:
            h.cancel()

    async def events(self) -> AsyncIterator[tuple[int, Event]]:
        while self.pending:
            i, ev = await self.queue.get()
            if isinstance(ev, (Finished, Failed)):
                self.pending -= 1
            yield i, ev


def failure_error(ev: Failed) -> ApiError:
    if ev.kind == "timeout":
        return ApiError(504, ev.message, type="timeout", code="deadline_exceeded")
    if ev.kind == "shutdown":
        return ApiError(503, ev.message, type="service_unavailable", code="shutting_down")
    if ev.kind == "cancelled":
        return ApiError(499, ev.message, code="cancelled")
    return ApiError(500, ev.message, type="server_error", code="generation_failed")


async def collect(gens: Generations) -> list[Outcome]:
    """Run to completion; the first failure cancels the rest and becomes the error."""
    outs = [Outcome() for _ in gens.requests]
    parts: list[list[str]] = [[] for _ in gens.requests]
    try:
        async for i, ev in gens.events():
            if isinstance(ev, TextDelta):
                parts[i].append(ev.text)
            elif isinstance(ev, Finished):
                outs[i].finish_reason = ev.reason
                outs[i].prompt_tokens = ev.prompt_tokens
                outs[i].completion_tokens = ev.completion_tokens
            else:
                raise failure_error(ev)
    finally:
        if gens.pending:
            gens.cancel()
    for i, o in enumerate(outs):
        o.text = "".join(parts[i])
    return outs


def deadline(config: Config) -> float:
    return time.monotonic() + config.server.limits.request_timeout_s
