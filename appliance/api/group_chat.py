"""A model group asked as a model: POST /v1/chat/completions whose `model` names a group, so that
any OpenAI client runs a group and reads its answer as a chat completion.

- sequential: the chain's output is the one choice (its last member's think block is its
  reasoning_content);
- fanout: the selected answer is the one choice;
- parallel: each member that answered is a choice, its index the member's place in the group.

Streamed, under the `strict` fallback (where any failure fails the whole answer) a parallel
group's members and a chain's last member stream as they write. Under the other fallbacks a
member may fail half-way or run again, so a member's text goes out when it is done and nothing
sent is taken back; a fanout's selected answer goes out once chosen, and a chain cut short gives
its output at the end. The one-answer APIs (Responses, Messages, Ollama) take a chain or a fanout
the same way (`relay_answer`), through their own writers."""

from __future__ import annotations

import time
import uuid
from typing import Callable

import msgspec

from ..config import GroupConfig
from ..groups.executor import GroupCall, GroupResult, MemberResult
from .answer_relay import AnswerWriter, Ending, Event, named_event, relay_failure, relay_whole
from .chat_answer import Parts
from .errors import ApiError, bad_request
from .generation import refuse_unsupported
from .group_routes import GroupRoutes, failure_body, failure_status
from .http import EventStream, Request
from .openai_routes import FINGERPRINT, Keep
from .schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatRequest,
    CompletionTokensDetails,
    Delta,
    ErrorEnvelope,
    Usage,
    encoder,
)

# and logit_bias (group_call); continue_final_message: a prefill (Anthropic's and Ollama's last
# assistant message) is one model's answer begun
_PER_MODEL = ("tools", "logprobs", "top_logprobs", "chat_template_kwargs", "lora", "continue_final_message")


def _usage(result: GroupResult) -> Usage:
    prompt = result.prompt_tokens()
    completion = sum(m.completion_tokens for m in result.members)
    reasoning = sum(m.reasoning_tokens for m in result.members)
    return Usage(prompt, completion, prompt + completion,
                 completion_tokens_details=CompletionTokensDetails(reasoning) if reasoning else None)


def _author(group: GroupConfig, result: GroupResult) -> MemberResult | None:
    """The member whose answer is a one-answer group's: a fanout's selected one, a chain's last
    that answered."""
    if group.type == "fanout":
        return next((m for m in result.members if result.selected and m.index == result.selected.index), None)
    return next((m for m in reversed(result.members) if m.ok), None)


def _answers(group: GroupConfig, result: GroupResult) -> list[tuple[int, str, str | None, str]]:
    """(choice index, text, reasoning, finish reason) of each choice the group's answer has."""
    if group.type == "parallel":
        return [(m.index, m.text, m.reasoning, m.finish_reason or "stop") for m in result.members if m.ok]
    by = _author(group, result)
    return [(0, result.output or "", by.reasoning if by else None, (by.finish_reason if by else None) or "stop")]


def _ending(group: GroupConfig, result: GroupResult, reason: str) -> Ending:
    """A group answer's end as answer_relay's writers take it: the members' tokens summed, the stop
    string that ended its answer, and the first token any member generated (its tokens' timings
    count from there)."""
    usage = _usage(result)
    reasoning = usage.completion_tokens_details.reasoning_tokens if usage.completion_tokens_details else 0
    by = _author(group, result)
    firsts = [m.first_token_at for m in result.members if m.ok and m.first_token_at is not None]
    return Ending(Parts(None, None, None, reason), usage.prompt_tokens, 0, usage.completion_tokens, reasoning,
                  by.stop_string if by is not None else None, min(firsts) if firsts else None)


def _group_failed(result: GroupResult) -> ApiError:
    body = failure_body(result)
    return ApiError(failure_status(result), body.message, type=body.type, param=body.param, code=body.code)


class GroupChat:
    def __init__(self, groups: GroupRoutes):
        self.groups = groups

    async def _call(self, req: ChatRequest, group: GroupConfig) -> GroupCall:
        """The group call a chat request makes; a field that is per model is a 400 naming it."""
        refuse_unsupported(req)
        if req.chat_template_kwargs and set(req.chat_template_kwargs) == {"enable_thinking"} and not req.reasoning_effort:
            # thinking on or off (Ollama's think, Anthropic's thinking) is every member's own switch:
            # off is effort none, on each member's default
            off = req.chat_template_kwargs["enable_thinking"] is False
            req = msgspec.structs.replace(req, chat_template_kwargs=None, reasoning_effort="none" if off else None)
        for field in _PER_MODEL:
            if getattr(req, field):
                raise bad_request(f"{field} is per model: it cannot be sent to the group {group.name!r}", param=field)
        if req.n != 1:
            raise bad_request("a group's answer has its own choices: n must be 1", param="n")
        if req.tool_choice not in (None, "none", "auto"):
            raise bad_request(f"tool_choice is per model: it cannot be sent to the group {group.name!r}",
                              param="tool_choice")
        return await self.groups.group_call(
            req, req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens, group.name)

    async def relay_answer(self, request: Request, req: ChatRequest, group: GroupConfig,
                           writer_for: Callable[[int], AnswerWriter], stream: bool,
                           framing: Callable[[Event], bytes] = named_event,
                           content_type: bytes = b"text/event-stream") -> None:
        """A chain's output or a fanout's choice, for APIs with one answer (the Responses,
        Messages and Ollama APIs), through the writer `writer_for(prompt tokens)` makes. Streamed,
        a chain under `strict` streams its last member as it writes; otherwise the answer goes out
        in one go once the group is done (a member may fail half-way and run again, a fanout
        chooses at the end)."""
        if group.type == "parallel":
            raise bad_request(f"the group {group.name!r} is parallel: it has one answer per member; ask it through "
                              "/v1/chat/completions (one choice each) or /v1/batch/execute", param="model")
        call = await self._call(req, group)
        if stream and group.type == "sequential" and group.fallback == "strict":
            await _LiveAnswer(self.groups, request, group, call, writer_for, framing, content_type).run()
            return
        sse = EventStream(request, content_type=content_type) if stream else None  # (keep-alives meanwhile)
        result = await self.groups.run_watched(request, group, call)  # (a 499 where the client went away)
        self.groups.on_result(group.name, result)
        if result.failed:
            if sse is None or not sse.started:
                raise _group_failed(result)
            await relay_failure(sse, writer_for(0), _group_failed(result), framing)
            return
        _, text, thought, reason = _answers(group, result)[0]
        ending = _ending(group, result, reason)
        await relay_whole(request, writer_for(ending.prompt_tokens), thought, text, ending, stream, framing,
                          content_type, sse)

    async def chat(self, request: Request, req: ChatRequest, group: GroupConfig,
                   keep: Keep | None = None) -> None:
        """`keep`: stores the answer (`store: true`), streamed or not: a stream's once the group is
        done, before its [DONE]."""
        call = await self._call(req, group)
        cid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            await _GroupStream(self.groups, request, group, call, cid, created, include_usage, keep).run()
            return
        result = await self.groups.run_watched(request, group, call)  # (a 499 where the client went away)
        self.groups.on_result(group.name, result)
        if result.failed:
            raise _group_failed(result)
        answer = _completion(group, result, cid, created)
        if keep is not None:
            keep(answer)
        await request.json(200, answer)


def _completion(group: GroupConfig, result: GroupResult, cid: str, created: int) -> ChatCompletion:
    """A group's whole answer as a chat completion: a choice per answer."""
    choices = [ChatChoice(i, AssistantMessage("assistant", text, None, thought), reason)
               for i, text, thought, reason in _answers(group, result)]
    return ChatCompletion(cid, created, group.name, choices, _usage(result), system_fingerprint=FINGERPRINT)


class _GroupStream:
    def __init__(self, groups: GroupRoutes, request: Request, group: GroupConfig, call: GroupCall, cid: str,
                 created: int, include_usage: bool, keep: Keep | None = None) -> None:
        self.groups = groups
        self.group = group
        self.call = call
        self.request = request
        self.sse = EventStream(request)
        self.cid, self.created = cid, created
        self.include_usage = include_usage
        self.keep = keep
        self.opened: set[int] = set()
        self.finished: set[int] = set()
        self.live = group.fallback == "strict"  # else a member's text goes out when it is done
        self.last = len(group.models) - 1

    def _chunk(self, choices: list[ChatChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(self.cid, self.created, self.group.name, choices, system_fingerprint=FINGERPRINT,
                                   usage=usage)

    def _streams(self, m: MemberResult) -> bool:
        """Whether this member's text is part of the answer: every member's in a parallel group,
        the last one's in a chain."""
        return self.group.type == "parallel" or (self.group.type == "sequential" and m.index == self.last)

    async def _text(self, index: int, text: str, thought: str | None) -> None:
        if index not in self.opened:
            # a parallel group's choices open together, in order: the OpenAI SDK's stream helper
            # takes a choice's index as its place in the list it has so far (an index 1 first
            # was an IndexError there)
            opening = range(len(self.group.models)) if self.group.type == "parallel" else (index,)
            for i in opening:
                if i not in self.opened:
                    self.opened.add(i)
                    await self.sse.event(self._chunk([ChatChunkChoice(i, Delta(role="assistant", content=""))]))
        if text or thought:
            await self.sse.event(self._chunk([ChatChunkChoice(index, Delta(content=text or None,
                                                                           reasoning_content=thought or None))]))

    async def _delta(self, m: MemberResult, text: str, thought: str) -> None:
        if self._streams(m) and self.live:
            await self._text(0 if self.group.type == "sequential" else m.index, text, thought)

    async def _done(self, m: MemberResult) -> None:
        if not self._streams(m) or not m.ok:
            return
        index = 0 if self.group.type == "sequential" else m.index
        if not self.live:
            await self._text(index, m.text, m.reasoning)
        await self._finish(index, m.finish_reason or "stop")

    async def _finish(self, index: int, reason: str) -> None:
        self.finished.add(index)
        await self.sse.event(self._chunk([ChatChunkChoice(index, Delta(), reason)]))

    async def run(self) -> None:
        try:
            result = await self.groups.run_watched(self.request, self.group, self.call, self._delta, self._done)
            self.groups.on_result(self.group.name, result)
            if result.failed:
                err = failure_body(result)
                if not self.sse.started:
                    raise _group_failed(result)
                await self.sse.raw(b"data: " + encoder.encode(ErrorEnvelope(err)) + b"\n\n")
            else:  # a fanout's choice, a chain cut short: what no member's end has given
                for index, text, thought, reason in _answers(self.group, result):
                    if index not in self.finished:
                        await self._text(index, text, thought)
                        await self._finish(index, reason)
                for index in sorted(self.opened - self.finished):  # a failed member's choice ends empty
                    await self._finish(index, "stop")
            if self.include_usage and not result.failed:
                await self.sse.event(self._chunk([], _usage(result)))
            if self.keep is not None and not result.failed:
                self.keep(_completion(self.group, result, self.cid, self.created))
            await self.sse.raw(b"data: [DONE]\n\n")
            await self.sse.close()
        except OSError:
            return  # the client went away; the executor's sequences were cancelled with its tasks


class _LiveAnswer:
    """A strict chain's one answer streamed through an API's writer as its last member writes;
    the writer starts with the last member's first piece (its prompt tokens counted so far: the
    members before it), and a failure after that is the writer's in-band error."""

    def __init__(self, groups: GroupRoutes, request: Request, group: GroupConfig, call: GroupCall,
                 writer_for: Callable[[int], AnswerWriter], framing: Callable[[Event], bytes],
                 content_type: bytes) -> None:
        self.groups, self.group, self.call = groups, group, call
        self.request = request
        self.sse = EventStream(request, content_type=content_type)
        self.writer_for, self.framing = writer_for, framing
        self.writer: AnswerWriter | None = None
        self.prompt_tokens = 0  # of the members done
        self.last = len(group.models) - 1

    async def _send(self, events: list[Event]) -> None:
        for event in events:
            await self.sse.raw(self.framing(event))

    async def _started(self) -> AnswerWriter:
        if self.writer is None:
            self.writer = self.writer_for(self.prompt_tokens)
            await self._send(self.writer.start())
        return self.writer

    async def _delta(self, m: MemberResult, text: str, thought: str) -> None:
        if m.index == self.last and (text or thought):
            await self._send((await self._started()).push(thought, text, []))

    async def _done(self, m: MemberResult) -> None:
        self.prompt_tokens += m.prompt_tokens

    async def run(self) -> None:
        try:
            result = await self.groups.run_watched(self.request, self.group, self.call, self._delta, self._done)
            self.groups.on_result(self.group.name, result)
            if result.failed:
                if self.writer is None and not self.sse.started:  # (no keep-alive started it either)
                    raise _group_failed(result)
                await self._send((await self._started()).failed(_group_failed(result)))
            else:
                _, text, thought, reason = _answers(self.group, result)[0]
                streamed = self.writer is not None
                writer = await self._started()
                if not streamed:  # a chain cut short before its last member: its output at the end
                    await self._send(writer.push(thought or "", text, []))
                await self._send(writer.finish(_ending(self.group, result, reason)))
            await self.sse.close()
        except OSError:
            return  # the client went away; the executor's sequences were cancelled with its tasks
