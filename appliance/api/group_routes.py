"""POST /v1/batch/execute (parallel and fanout groups) and POST /v1/chain/execute (sequential)."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Callable

import msgspec

from ..config import Config
from ..engine.manager import ModelManager
from ..groups.executor import DeltaHook, DoneHook, GroupCall, GroupExecutor, GroupResult, MemberResult
from ..observability import context
from .errors import ApiError, bad_request, decoded
from .generation import deadline, plain_messages, request_sampling, stop_list
from .http import EventStream, Request
from .schemas import (
    ChatRequest,
    ErrorBody,
    GroupDone,
    GroupExecution,
    GroupFailure,
    GroupRequest,
    MemberDelta,
    MemberDone,
    MemberOut,
    SelectedOut,
    Usage,
    encoder,
)

_decoder = msgspec.json.Decoder(GroupRequest)


def member_out(m: MemberResult) -> MemberOut:
    usage = Usage(m.prompt_tokens, m.completion_tokens, m.prompt_tokens + m.completion_tokens)
    return MemberOut(m.index, m.model, m.status, m.text, m.finish_reason, usage, round(m.latency_ms, 1), m.attempts,
                     m.error, m.replaced_by, m.mean_logprob, m.reasoning)


def execution_out(result: GroupResult, exec_id: str, created: int) -> GroupExecution:
    members = [member_out(m) for m in result.members]
    prompt = result.prompt_tokens()
    completion = sum(m.usage.completion_tokens for m in members)
    selected = SelectedOut(result.selected.index, result.selected.model, result.selected.reason) if result.selected else None
    return GroupExecution(exec_id, created, result.group, result.type, result.complete, members,
                          Usage(prompt, completion, prompt + completion), result.output, selected)


def failure_body(result: GroupResult) -> ErrorBody:
    """A failed group's error: the request's own fault where every member refused it (its prompt
    too long, max_tokens over the limit: a 400 naming the field), else the members' (a 502)."""
    if (refused := result.refusal()) is not None:
        return ErrorBody(f"group '{result.group}': {result.error}", "invalid_request_error", refused.param,
                         refused.code)
    if result.past_deadline():
        return ErrorBody(f"group '{result.group}': the request's deadline passed: {result.error}", "timeout", None,
                         "deadline_exceeded")
    return ErrorBody(f"group '{result.group}' failed: {result.error}", "upstream_error", None, "group_failed")


def failure_status(result: GroupResult) -> int:
    if result.refusal() is not None:
        return 400
    return 504 if result.past_deadline() else 502


class GroupRoutes:
    def __init__(self, config: Config, manager: ModelManager):
        self.manager = manager
        self.on_result: Callable[[str, GroupResult], None] = lambda _group, _result: None  # metrics
        self.set_config(config)

    def set_config(self, config: Config) -> None:
        self.config = config
        limits = config.server.limits
        self.executor = GroupExecutor(self.manager.ready_runner, limits.max_tokens, limits.max_prompt_tokens,
                                      hold=lambda runner: self.manager.hold_runner(runner))

    async def batch(self, request: Request) -> None:
        await self._execute(request, ("parallel", "fanout"), "/v1/chain/execute")

    async def chain(self, request: Request) -> None:
        await self._execute(request, ("sequential",), "/v1/batch/execute")

    async def _execute(self, request: Request, types: tuple[str, ...], other: str) -> None:
        body = await request.body(self.config.server.limits.max_body_bytes)
        req: GroupRequest = decoded(_decoder, body)
        group = self.config.group(req.group)
        if group is None:
            raise ApiError(404, f"group '{req.group}' does not exist", param="group", code="group_not_found")
        if group.type not in types:
            raise bad_request(f"group '{group.name}' is {group.type}; run it with {other}", param="group")
        call = await self.group_call(req, req.max_tokens, group.name)
        exec_id, created = f"grp-{uuid.uuid4().hex}", int(time.time())
        if req.stream:
            await self._stream(request, group, call, exec_id, created)
            return
        result = await self.run_watched(request, group, call)
        self.on_result(group.name, result)
        out = execution_out(result, exec_id, created)
        if result.failed:
            await request.respond(failure_status(result), encoder.encode(GroupFailure(failure_body(result), out)))
        else:
            await request.json(200, out)

    async def group_call(self, req: GroupRequest | ChatRequest, max_tokens: int | None, group: str) -> GroupCall:
        """What a group request (or a chat request naming a group: api/group_chat.py) asks of the
        group's members; logit_bias, which is per vocabulary, is a 400. The request is accounted
        as the group's (metrics, access log, audit)."""
        if (info := context.current.get()) is not None:
            info.group = group
        if req.logit_bias:
            raise bad_request("logit_bias is per vocabulary and not supported for groups", param="logit_bias")
        return GroupCall(
            messages=plain_messages(req.messages),
            sampling=await request_sampling(req, None),  # members' vocabularies differ
            max_tokens=max_tokens,
            stop=stop_list(req),
            deadline=deadline(self.config),
            reasoning_format=req.reasoning_format,
            reasoning_effort=req.reasoning_effort,
            thinking_budget_tokens=req.thinking_budget_tokens,
        )

    async def run_watched(self, request: Request, group, call: GroupCall, on_delta: DeltaHook | None = None,
                          on_done: DoneHook | None = None) -> GroupResult:
        """The group's result; where the client goes away first, its members' sequences are
        cancelled (at their runners' next step) and a 499 is raised. A stream's writes cannot tell:
        the server drops what is sent to a gone client without an error."""
        hooks = {k: v for k, v in (("on_delta", on_delta), ("on_done", on_done)) if v is not None}
        task = asyncio.ensure_future(self.executor.run(group, call, **hooks))
        watcher = asyncio.ensure_future(request.watch_disconnect())
        try:
            await asyncio.wait([task, watcher], return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if task.cancelled():
            raise ApiError(499, "client disconnected", code="cancelled")
        return task.result()

    async def _stream(self, request: Request, group, call: GroupCall, exec_id: str, created: int) -> None:
        sse = EventStream(request)

        async def on_delta(m: MemberResult, text: str, thought: str) -> None:
            await sse.event(MemberDelta(m.index, m.answering or m.model, text, thought or None, max(m.attempts, 1)))

        async def on_done(m: MemberResult) -> None:
            await sse.event(MemberDone(member_out(m)))

        try:
            result = await self.run_watched(request, group, call, on_delta, on_done)
            self.on_result(group.name, result)
            await sse.event(GroupDone(execution_out(result, exec_id, created),
                                      failure_body(result) if result.failed else None))
            await sse.raw(b"data: [DONE]\n\n")
            await sse.close()
        except OSError:
            return  # client went away; the executor's sequences were cancelled with its tasks
