"""Runs a model group: parallel, sequential (chain) or fanout, with its fallback and selection."""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field, replace
from typing import Awaitable, Callable, Iterable

from ..config import GroupConfig
from ..engine.manager import InsufficientMemory, PolicyRefused
from ..engine.client import Generations, PromptError, fit_max_tokens, render_chat
from ..engine.runner import (
    Failed,
    Finished,
    GenerationRequest,
    ModelRunner,
    NotReady,
    QueueFull,
    TextDelta,
)
from ..engine.sampling import SamplingParams, with_seed_offset
from ..engine import reasoning
from ..policy import PluginError
from . import select as selection

OK_STATES = ("ok", "replaced")


@dataclass
class MemberResult:
    index: int
    model: str
    status: str = "skipped"  # ok | failed | timeout | replaced | skipped
    text: str = ""  # the answer; a think block is apart, in `reasoning` (engine/reasoning.py)
    reasoning: str | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0  # of completion_tokens, generated inside a think block
    latency_ms: float = 0.0
    error: str | None = None
    attempts: int = 0
    replaced_by: str | None = None
    mean_logprob: float | None = None
    refused: PromptError | None = None  # failed on the request itself (its prompt or limits), not the model
    answering: str | None = None  # the model of its attempt under way (a replacement's, once replaced)
    stop_string: str | None = None  # the request's stop string that ended its answer
    past_deadline: bool = False  # it timed out on the request's deadline, not its own bound
    first_token_at: float | None = None  # time.monotonic() of its answer's first token

    @property
    def ok(self) -> bool:
        return self.status in OK_STATES


@dataclass
class Selected:
    index: int
    model: str
    reason: str


@dataclass
class GroupResult:
    group: str
    type: str
    complete: bool
    members: list[MemberResult]
    output: str | None = None
    selected: Selected | None = None
    failed: bool = False  # strict fallback: the request as a whole failed
    error: str | None = None
    fallback: str = "strict"  # the group's: strict, partial, retry_once or replace_with

    def refusal(self) -> PromptError | None:
        """The request's own fault (a 400), where the group failed with no answer and every member
        that ran failed on the request itself (its prompt or limits)."""
        ran = [m for m in self.members if m.attempts]
        if not self.failed or not ran or any(m.ok or m.refused is None for m in ran):
            return None
        return ran[0].refused

    def past_deadline(self) -> bool:
        """Whether the group failed because the request's deadline passed for every member that ran."""
        ran = [m for m in self.members if m.attempts]
        return self.failed and bool(ran) and all(m.past_deadline for m in ran)

    def prompt_tokens(self) -> int:
        """The prompt tokens its members took: a fanout's samples on one model share one prefill
        (the prompt counts once for each model, as `n` choices count it), every other member
        makes its own."""
        if self.type != "fanout":
            return sum(m.prompt_tokens for m in self.members)
        by_model: dict[str, int] = {}
        for m in self.members:
            by_model[m.model] = max(by_model.get(m.model, 0), m.prompt_tokens)
        return sum(by_model.values())


@dataclass(frozen=True)
class GroupCall:
    messages: list[dict[str, str]]
    sampling: SamplingParams
    max_tokens: int | None
    stop: list[str] = field(default_factory=list)
    deadline: float = float("inf")
    reasoning_format: str | None = None  # None: each member model's own (models[].reasoning_format)
    # as on chat: thinking on or off and its budget in each member (engine/reasoning.py)
    reasoning_effort: str | None = None
    thinking_budget_tokens: int | None = None


# Called for every piece of streamed text (the answer's, and a think block's) and for every
# finished member.
DeltaHook = Callable[[MemberResult, str, str], Awaitable[None]]
DoneHook = Callable[[MemberResult], Awaitable[None]]


async def _noop_delta(_m: MemberResult, _t: str, _r: str) -> None:
    return None


async def _noop_done(_m: MemberResult) -> None:
    return None


class GroupExecutor:
    def __init__(self, resolve: Callable[[str], Awaitable[ModelRunner]], max_tokens_cap: int | None = None,
                 max_prompt_tokens: int | None = None,
                 hold: Callable[[ModelRunner], Callable[[], None]] = lambda _runner: lambda: None):
        """`resolve` returns a model's ready runner (loading it if the strategy does so) or raises;
        `hold` marks its model in use until the release it returns is called (no eviction for a
        sibling member's load takes it from under an attempt)."""
        self.resolve = resolve
        self.hold = hold
        self.max_tokens_cap = max_tokens_cap
        self.max_prompt_tokens = max_prompt_tokens

    async def run(
        self,
        group: GroupConfig,
        call: GroupCall,
        on_delta: DeltaHook = _noop_delta,
        on_done: DoneHook = _noop_done,
    ) -> GroupResult:
        if group.type == "sequential":
            return await self._chain(group, call, on_delta, on_done)
        if group.type == "fanout":
            return await self._fanout(group, call, on_delta, on_done)
        return await self._parallel(group, call, on_delta, on_done)

    # ---- one model's attempt ---------------------------------------------------------------

    async def _attempt(
        self, model: str, members: list[MemberResult], call: GroupCall, group: GroupConfig, on_delta: DeltaHook
    ) -> None:
        """Run one model for `members` (several members = samples sharing one prompt's KV)."""
        t0 = time.monotonic()
        for m in members:
            m.attempts += 1
            m.refused = None
            m.past_deadline = False
            m.answering = model
        until = min(call.deadline, t0 + group.timeout_s(model))
        release = None

        async def taken() -> tuple[ModelRunner, Callable[[], None]]:
            runner = await self.resolve(model)
            return runner, self.hold(runner)  # (at once: no sibling's load evicts it in between)

        try:
            try:
                # the member's bound holds while its model loads too
                left = until - time.monotonic()
                runner, release = await asyncio.wait_for(taken(), None if math.isinf(left) else max(0.0, left))
            except KeyError:
                raise NotReady(f"model {model!r} is not configured") from None
            except NotReady as e:
                raise NotReady(f"model {model!r} is not available: {e}") from None
            except TimeoutError:
                if time.monotonic() < until - 0.05:  # (the loop's timer may fire a hair early)
                    raise  # the load's own bound (policy.load_timeout_s)
                for m in members:
                    _fail(m, "timeout", self._timeout_reason(group, call, model, until) + " while the model loaded", t0)
                    m.past_deadline = until >= call.deadline
                return
            budget = reasoning.budget_tokens(runner.cfg, call.thinking_budget_tokens, call.reasoning_effort)
            variables = {**reasoning.budget_kwargs(runner.template.source, budget), **runner.cfg.chat_template_kwargs,
                         **reasoning.effort_kwargs(call.reasoning_effort)}
            prompt = await asyncio.to_thread(render_chat, runner, call.messages, None, variables)
            max_tokens = fit_max_tokens(runner.n_ctx, len(prompt), call.max_tokens, None, self.max_tokens_cap, "messages",
                                        self.max_prompt_tokens)
            sampling = reasoning.with_budget(runner, prompt, call.sampling, budget)
            # each member a sample of its own: seeded draws differ between members (a model listed
            # twice), a sequential member's as its model would answer alone
            reqs = [
                GenerationRequest(prompt, max_tokens,
                                  with_seed_offset(sampling, 0 if group.type == "sequential" else m.index),
                                  call.stop, until, logprobs=True)
                for m in members
            ]
            gens = Generations(runner, reqs)
            gens.start()
        except (NotReady, QueueFull, PromptError, PolicyRefused, InsufficientMemory, TimeoutError, PluginError) as e:
            if release is not None:
                release()
            for m in members:
                _fail(m, "failed", _describe(e), t0)
                m.refused = e if isinstance(e, PromptError) else None
            return
        except BaseException:
            if release is not None:
                release()
            raise
        think, inside = reasoning.for_answer(runner, call.reasoning_format, prompt)
        splitters = [reasoning.Splitter(inside, think) if think else None for _ in members]
        parts: list[list[str]] = [[] for _ in members]
        try:
            async for i, ev in gens.events():
                m = members[i]
                if isinstance(ev, TextDelta):
                    parts[i].append(ev.text)
                    thought, text = splitters[i].push(ev.text) if splitters[i] else ("", ev.text)
                    if thought or text:
                        await on_delta(m, text, thought)
                elif isinstance(ev, Finished):
                    whole = "".join(parts[i])
                    if splitters[i]:  # the next member of a chain gets the answer without the thinking
                        thought, text = splitters[i].finish()
                        if thought or text:
                            await on_delta(m, text, thought)
                        m.reasoning, whole = reasoning.split(whole, inside, think)
                    m.status, m.text, m.finish_reason = "ok", whole, ev.reason
                    m.prompt_tokens, m.completion_tokens, m.mean_logprob = ev.prompt_tokens, ev.completion_tokens, ev.mean_logprob
                    m.reasoning_tokens = ev.reasoning_tokens
                    m.stop_string, m.first_token_at = ev.stop_string, ev.first_token_at
                    m.latency_ms = (time.monotonic() - t0) * 1000
                    m.error = None
                elif isinstance(ev, Failed):
                    m.text = "".join(parts[i])
                    why = ev.message
                    if ev.kind == "timeout" and until < call.deadline:  # the member's own bound, not the request's
                        why = self._timeout_reason(group, call, model, until)
                    _fail(m, "timeout" if ev.kind == "timeout" else "failed", why, t0)
                    m.past_deadline = ev.kind == "timeout" and until >= call.deadline
        except asyncio.CancelledError:
            gens.cancel()
            raise
        finally:
            if gens.pending:
                gens.cancel()
            release()

    @staticmethod
    def _timeout_reason(group: GroupConfig, call: GroupCall, model: str, until: float) -> str:
        if until >= call.deadline:
            return "the request's deadline passed"
        key = "member_timeout_ms" if model in group.member_timeout_ms else "timeout_ms"
        return f"the group's {key} for {model} ({group.timeout_s(model) * 1000:.0f} ms) passed"

    async def _member(
        self, model: str, members: list[MemberResult], call: GroupCall, group: GroupConfig, on_delta: DeltaHook
    ) -> None:
        """One model's members with the group's fallback applied."""
        await self._attempt(model, members, call, group, on_delta)
        failed = [m for m in members if not m.ok]
        if not failed or group.fallback in ("strict", "partial"):
            return
        if group.fallback == "retry_once":
            await self._attempt(model, failed, call, group, on_delta)
            return
        backup = group.replacement
        first_errors = {m.index: (m.status, m.error) for m in failed}
        await self._attempt(backup, failed, call, group, on_delta)
        for m in failed:
            status, error = first_errors[m.index]
            if m.ok:
                m.status, m.replaced_by = "replaced", backup
                m.error = f"{m.model} {status}: {error}"
            else:  # (the group's error names the member's model before it)
                m.error = f"{error}; replacement {backup} {m.status}: {m.error}"

    # ---- group types -----------------------------------------------------------------------

    async def _parallel(self, group: GroupConfig, call: GroupCall, on_delta: DeltaHook, on_done: DoneHook) -> GroupResult:
        members = [MemberResult(i, model) for i, model in enumerate(group.models)]

        async def one(m: MemberResult) -> None:
            await self._member(m.model, [m], call, group, on_delta)
            await on_done(m)

        await _all(one(m) for m in members)
        return self._finish(group, members)

    async def _fanout(self, group: GroupConfig, call: GroupCall, on_delta: DeltaHook, on_done: DoneHook) -> GroupResult:
        members: list[MemberResult] = []
        by_model: list[tuple[str, list[MemberResult]]] = []
        for model in group.models:
            batch = [MemberResult(len(members) + k, model) for k in range(group.samples)]
            members.extend(batch)
            by_model.append((model, batch))
        first_done = asyncio.Event()

        async def one(model: str, batch: list[MemberResult]) -> None:
            await self._member(model, batch, call, group, on_delta)
            for m in batch:
                await on_done(m)
            if any(m.ok for m in batch):
                first_done.set()

        if group.select == "first":
            tasks = [asyncio.ensure_future(one(model, batch)) for model, batch in by_model]
            waiter = asyncio.ensure_future(first_done.wait())
            try:
                await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
                if not first_done.is_set():
                    await asyncio.gather(*tasks)
            finally:  # the others are not needed (or the request went away): they stop
                for t in (*tasks, waiter):
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            for m in members:
                if m.attempts and not m.ok and m.status == "skipped":
                    m.error = "not needed: an earlier answer was selected"
        else:
            await _all(one(model, batch) for model, batch in by_model)
        result = self._finish(group, members)
        if not result.failed:
            result.selected = await self._select(group, call, members)
            if result.selected is not None:
                result.output = members[result.selected.index].text
        return result

    async def _chain(self, group: GroupConfig, call: GroupCall, on_delta: DeltaHook, on_done: DoneHook) -> GroupResult:
        members = [MemberResult(i, model) for i, model in enumerate(group.models)]
        messages = call.messages
        output: str | None = None
        for i, m in enumerate(members):
            template = group.prompt_templates[i] if group.prompt_templates else None
            if i == 0:
                step_messages = _apply_template(messages, template)
            else:
                step_messages = [{"role": "user", "content": (template or "{input}").replace("{input}", output or "")}]
            step = replace(call, messages=step_messages)
            if i < len(members) - 1 and call.sampling.grammar is not None:
                step = replace(step, sampling=replace(call.sampling, grammar=None))  # the grammar shapes the output
            await self._member(m.model, [m], step, group, on_delta)
            await on_done(m)
            if not m.ok:
                break
            output = m.text
        result = self._finish(group, members)
        result.output = output
        return result

    # ---- outcome ---------------------------------------------------------------------------

    def _finish(self, group: GroupConfig, members: list[MemberResult]) -> GroupResult:
        ok = sum(1 for m in members if m.ok)
        if group.type == "sequential":
            required = len(members)
        else:
            required = group.required_responses or len(members)
        ran = [m for m in members if m.attempts]
        failed = [m for m in ran if not m.ok]
        result = GroupResult(group.name, group.type, complete=ok >= required and (group.type != "sequential" or not failed),
                             members=members, fallback="replace_with" if group.replacement else str(group.fallback))
        if group.type == "fanout" and group.select == "first":
            result.complete = ok >= 1
        if failed and (group.fallback == "strict" or ok == 0):  # no answer at all fails under any fallback
            result.failed, result.complete = True, False
            result.error = "; ".join(f"{m.model} {m.status}: {m.error}" for m in failed)
        elif ok < required and not (group.type == "fanout" and group.select == "first" and ok):
            result.error = f"{ok} of {len(members)} members answered; {required} required"
        return result

    async def _select(self, group: GroupConfig, call: GroupCall, members: list[MemberResult]) -> Selected | None:
        valid = [m for m in members if m.ok]
        if not valid:
            return None
        if group.select == "first":
            best = min(valid, key=lambda m: m.latency_ms)
            return Selected(best.index, best.model, f"first valid answer ({best.latency_ms:.0f} ms)")
        if group.select == "logprob":
            i, reason = selection.by_logprob([m.mean_logprob for m in valid])
            return Selected(valid[i].index, valid[i].model, reason)
        if group.select.startswith("judge:"):
            picked = await self._judge(group.select[6:], call, valid)
            if picked is not None:
                return picked
        # (quadratic in the answers and their lengths: off the event loop)
        i, reason = await asyncio.to_thread(selection.consensus, [m.text for m in valid])
        if group.select.startswith("judge:"):
            reason = f"judge gave no valid choice; {reason}"
        return Selected(valid[i].index, valid[i].model, reason)

    async def _judge(self, judge: str, call: GroupCall, valid: list[MemberResult]) -> Selected | None:
        question = next((m["content"] for m in reversed(call.messages) if m["role"] == "user"), "")
        verdict = MemberResult(-1, judge)
        judge_group = GroupConfig(name="judge", models=[judge], fallback="partial")
        judge_call = GroupCall(selection.judge_prompt(question, [m.text for m in valid]),
                               SamplingParams(temperature=0.0), 8, [], call.deadline)
        await self._attempt(judge, [verdict], judge_call, judge_group, _noop_delta)
        if not verdict.ok:
            return None
        k = selection.parse_judgement(verdict.text, len(valid))
        if k is None:
            return None
        return Selected(valid[k].index, valid[k].model, f"judge {judge} chose answer {k + 1}: {verdict.text.strip()!r}")


async def _all(coros: Iterable[Awaitable[None]]) -> None:
    """Await them all; where one raises (or this is cancelled), the others are cancelled, not
    left running for nobody (asyncio.gather leaves them)."""
    tasks = [asyncio.ensure_future(c) for c in coros]
    try:
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _fail(m: MemberResult, status: str, error: str, t0: float) -> None:
    m.status, m.error = status, error
    m.latency_ms = (time.monotonic() - t0) * 1000


def _describe(e: Exception) -> str:
    if isinstance(e, QueueFull):
        return f"model {e} has too many requests queued"
    if isinstance(e, TimeoutError):
        return "the model did not load in time"
    return str(e)


def _apply_template(messages: list[dict[str, str]], template: str | None) -> list[dict[str, str]]:
    if not template:
        return messages
    out = list(messages)
    for i in range(len(out) - 1, -1, -1):
        if out[i]["role"] == "user":
            out[i] = {**out[i], "content": template.replace("{input}", out[i]["content"])}
            break
    return out
