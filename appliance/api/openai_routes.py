"""POST /v1/chat/completions, POST /v1/completions, GET /v1/models."""

from __future__ import annotations

import asyncio
import codecs
import math
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Callable

import msgspec

from ..config import Config, GroupConfig
from ..engine.manager import ModelManager
from ..engine.runner import Failed, Finished, GenerationRequest, ModelRunner, PromptScored, TextDelta, TokenLogprob
from .errors import ApiError, bad_request, decoded
from ..engine.client import Generations, Outcome, Outcomes, collect, fit_max_tokens
from ..engine.sampling import with_seed_offset
from .generation import (
    ENGINE_ERRORS,
    chat_answer_plan,
    completion_prompts,
    deadline,
    echo_texts,
    engine_error,
    failure_error,
    generation_runner,
    prediction_index,
    request_sampling,
    serve,
    stop_list,
)
from ..engine import reasoning
from . import legacy_functions, native_tools
from .anthropic_schemas import AnthropicModel, AnthropicModelList
from .call_stream import CallDelta
from .item_pages import id_page
from .chat_answer import AnswerReader, AnswerShape
from .http import EventStream, Request
from .schemas import (
    AssistantMessage,
    ChatChoice,
    ChatChunkChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatLogprobs,
    ChatRequest,
    ChatTokenLogprob,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    CompletionRequest,
    CompletionTokensDetails,
    Delta,
    FunctionCallDelta,
    ModelCard,
    ModelList,
    PromptTokensDetails,
    ToolCallDelta,
    TopLogprob,
    Usage,
)

if TYPE_CHECKING:  # group_chat imports this module
    from .chat_completion_routes import StoredChatRoutes
    from .group_chat import GroupChat

Keep = Callable[[ChatCompletion], None]  # stores a chat answer made with `store: true`

FINGERPRINT = "eie"
_chat_decoder = msgspec.json.Decoder(ChatRequest)
_completion_decoder = msgspec.json.Decoder(CompletionRequest)


def _usage(outs_prompt: int, completion: int, cached: int, details: tuple[int, int, int] = (0, 0, 0),
           predicted: bool = False) -> Usage:
    """`details`: reasoning, accepted and rejected prediction tokens (completion_tokens_details
    where any is not 0, or where the request sent a prediction: OpenAI's always has them then)."""
    return Usage(outs_prompt, completion, outs_prompt + completion, PromptTokensDetails(cached),
                 CompletionTokensDetails(*details) if any(details) or predicted else None)


def _details(ev: Finished | Outcome) -> tuple[int, int, int]:
    """A finished sequence's (Finished, Outcome) completion token details."""
    return ev.reasoning_tokens, ev.accepted_prediction_tokens, ev.rejected_prediction_tokens


def _text(b: bytes) -> str:
    return b.decode("utf-8", errors="replace")


def chat_logprobs(entries: list[TokenLogprob] | tuple[TokenLogprob, ...]) -> ChatLogprobs:
    return ChatLogprobs([
        ChatTokenLogprob(_text(e.token), e.logprob, list(e.token),
                         [TopLogprob(_text(t), lp, list(t)) for t, lp in e.top])
        for e in entries
    ])


@dataclass(frozen=True)
class Echo:
    """A scored prompt as completion logprobs show it: its first token's piece, then the others."""

    first: bytes
    scored: tuple[TokenLogprob, ...]


def completion_logprobs(entries: list[TokenLogprob] | tuple[TokenLogprob, ...],
                        echoed: Echo | None = None, start: int = 0) -> CompletionLogprobs:
    """OpenAI's completion logprobs; `echoed`: the scored prompt they start with (its first token
    has no log-probability); `start`: the text offset of their first token (a stream's chunk
    after others)."""
    tokens: list[str] = []
    pieces: list[bytes] = []
    logprobs: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    if echoed is not None:
        tokens.append(_text(echoed.first))
        pieces.append(echoed.first)
        logprobs.append(None)
        tops.append(None)
    for e in (*echoed.scored, *entries) if echoed is not None else entries:
        tokens.append(_text(e.token))
        pieces.append(e.token)
        logprobs.append(e.logprob)
        tops.append({_text(t): lp for t, lp in e.top})
    # offsets into the text, which holds a character split across tokens once (each piece shows
    # it as U+FFFD): the whole characters before each token
    offsets, whole = [], 0
    decoder = codecs.getincrementaldecoder("utf-8")(errors="ignore")  # (a split character counts once whole)
    for piece in pieces:
        offsets.append(start + whole)
        whole += len(decoder.decode(piece))
    return CompletionLogprobs(tokens=tokens, token_logprobs=logprobs, top_logprobs=tops, text_offset=offsets)


class OpenAIRoutes:
    def __init__(self, config: Config, manager: ModelManager):
        self.config = config
        self.manager = manager
        self.created = int(time.time())
        self.groups: GroupChat | None = None  # a group asked as a model (api/group_chat.py; set by the app)
        self.stored: StoredChatRoutes | None = None  # stored chat completions (set by the app)

    async def models(self, request: Request) -> None:
        cards = [card for name, r in self.manager.runners.items() for card in self._cards(name, r)]
        if request.header("anthropic-version") is None:
            await request.json(200, ModelList(cards + [self._group_card(g) for g in self.config.groups]))
            return
        # Anthropic's SDKs (they send anthropic-version) read the list in their form, paged (and
        # their errors in theirs: the app's route says so)
        models = [self._anthropic_card(c) for c in cards]
        page, more = id_page(models, [m.id for m in models], request, "model")
        await request.json(200, AnthropicModelList(page, page[0].id if page else None, page[-1].id if page else None,
                                                   more))

    async def model(self, request: Request) -> None:
        """GET /v1/models/{model_id}: one card of the list (a model or a group), in Anthropic's
        form when anthropic-version is sent (models only, as in the list)."""
        name = request.path_params["model_id"]
        anthropic = request.header("anthropic-version") is not None
        base = self.manager.config.base_of(name)
        runner = self.manager.runners.get(base)
        card = next((c for c in self._cards(base, runner) if c.id == name), None) if runner is not None else None
        if card is not None:
            await request.json(200, self._anthropic_card(card) if anthropic else card)
            return
        group = self.config.group(name)
        if group is not None and not anthropic:
            await request.json(200, self._group_card(group))
            return
        raise ApiError(404, f"model '{name}' is not configured", param="model", code="model_not_found")

    def _anthropic_card(self, card: ModelCard) -> AnthropicModel:
        created = datetime.fromtimestamp(self.created, timezone.utc).isoformat().replace("+00:00", "Z")
        return AnthropicModel(card.id, card.id, created, max_input_tokens=card.context_length)

    def _group_card(self, group: GroupConfig) -> ModelCard:
        """A group, which /v1/chat/completions takes as a model (api/group_chat.py)."""
        runners = [self.manager.runners[self.config.base_of(m)] for m in group.models]
        state = next((r.state for r in runners if r.state != "ready"), "ready")  # the first member not ready
        return ModelCard(group.name, self.created, "eie", state, kind="group",
                         context_length=min(r.n_ctx for r in runners), group_type=group.type,
                         members=list(group.models))

    def _cards(self, name: str, runner: ModelRunner) -> list[ModelCard]:
        """The model's card, then one per LoRA adapter it serves."""
        card = self._card(name, runner)
        return [card, *(msgspec.structs.replace(card, id=a.name, adapter_of=name) for a in runner.cfg.lora)]

    def _card(self, name: str, runner: ModelRunner) -> ModelCard:
        reranks = runner.reranker or runner.cfg.pooling == "rank"
        kind = ("rerank" if reranks else "embedding") if runner.cfg.embedding else "chat"
        card = ModelCard(name, self.created, "eie", runner.state, kind=kind, context_length=runner.n_ctx,
                         control_vectors=[c.path for c in runner.cfg.control_vectors] or None)
        if kind != "chat" or runner.state != "ready":
            return card
        native = native_tools.format_of(runner.template, runner.vocab)
        return msgspec.structs.replace(card, tool_format=native.name if native else "eie",
                                       reasoning=reasoning.applies(runner.template.source, "auto"))

    async def chat(self, request: Request) -> None:
        try:
            await self._chat(request)
        except ENGINE_ERRORS as e:
            raise engine_error(e) from None

    async def completions(self, request: Request) -> None:
        try:
            await self._completions(request)
        except ENGINE_ERRORS as e:
            raise engine_error(e) from None

    def _max_tokens(self, runner: ModelRunner, prompt: list[int], requested: int | None, default: int | None,
                    param: str) -> int:
        limits = self.config.server.limits
        return fit_max_tokens(runner.n_ctx, len(prompt), requested, default, limits.max_tokens, param,
                              limits.max_prompt_tokens)

    async def _chat(self, request: Request) -> None:
        req: ChatRequest = decoded(_chat_decoder, await request.body(self.config.server.limits.max_body_bytes))
        asked = req
        keep: Keep | None = (lambda c: self.stored.keep(asked, c)) if req.store and self.stored is not None else None
        group = self.config.group(req.model)  # a group may not share a model's name (config.py)
        if group is not None and self.groups is not None:
            if req.functions is not None:
                raise bad_request("a group takes tools, not the deprecated functions", param="functions")
            await self.groups.chat(request, req, group, keep)
            return
        req, legacy = legacy_functions.as_tools(req)
        runner = await generation_runner(self.manager, req.model, req.lora, request if req.stream else None)
        try:
            prompt, params, shape = await chat_answer_plan(runner, req)
        except ApiError as e:
            raise legacy_functions.legacy_error(e) if legacy else e
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        max_tokens = self._max_tokens(runner, prompt, requested, None, "messages")
        stops = stop_list(req)
        until = deadline(self.config)
        if req.top_logprobs is not None and not req.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
        top = (req.top_logprobs or 0) if req.logprobs else None
        predicted = await prediction_index(runner, req)
        gens = Generations(runner, [
            GenerationRequest(prompt, max_tokens, with_seed_offset(params, i), stops, until, top_logprobs=top,
                              speculative=req.speculative, predicted=predicted)
            for i in range(req.n)
        ])
        await self._run(request, gens, req.stream, req.stream_options and req.stream_options.include_usage,
                        lambda *a: self._chat_stream(*a, shape=shape, legacy=legacy, keep=keep,
                                                     predicted=req.prediction is not None),
                        lambda *a: _kept(self._chat_response(*a, shape=shape, legacy=legacy,
                                                             predicted=req.prediction is not None), keep), req.model,
                        top is not None)

    async def _completions(self, request: Request) -> None:
        req: CompletionRequest = decoded(_completion_decoder, await request.body(self.config.server.limits.max_body_bytes))
        runner = await generation_runner(self.manager, req.model, req.lora, request if req.stream else None)
        params = await request_sampling(req, runner.vocab)
        prompts = await asyncio.to_thread(completion_prompts, runner, req)
        # OpenAI's default for the legacy completions endpoint is 16 tokens.
        limits = [self._max_tokens(runner, p, req.max_tokens, 16, "prompt") for p in prompts]
        stops = stop_list(req)
        until = deadline(self.config)
        score = req.logprobs if req.echo else None
        candidates = _candidates(req)
        # A prompt's choices share one list, so that the first prefills it (scoring it, where the
        # prompt is scored) and the others copy its KV: the scores are the first's for them all.
        seqs = [
            GenerationRequest(shared, m, with_seed_offset(params, i), stops, until, logprobs=candidates > req.n,
                              top_logprobs=req.logprobs, speculative=req.speculative,
                              prompt_logprobs=score if i == 0 else None)
            for shared, m in ((list(p), m) for p, m in zip(prompts, limits))
            for i in range(candidates)
        ]
        echoes = None
        if req.echo:
            texts = await asyncio.to_thread(echo_texts, runner, req, prompts)
            echoes = [(texts[k // candidates], runner.vocab.piece(seqs[k].prompt[0])) for k in range(len(seqs))]

        def respond(outs, model: str, logprobs: bool) -> Completion:
            for k, o in enumerate(outs):  # a follower's prompt scores: its prompt's first choice's
                if o.prompt_logprobs is None:
                    o.prompt_logprobs = outs[k - k % candidates].prompt_logprobs
            kept = best_of(outs, candidates, req.n)
            return self._completion_response([outs[k] for k in kept], model, logprobs,
                                             [echoes[k] for k in kept] if echoes else None, counted=outs,
                                             per_prompt=candidates)

        await self._run(request, Generations(runner, seqs), req.stream,
                        req.stream_options and req.stream_options.include_usage,
                        lambda *a: self._completion_stream(*a, echoes=echoes, choices=candidates), respond,
                        req.model, req.logprobs is not None)

    async def _run(self, request: Request, gens: Generations, stream: bool, include_usage: bool | None,
                   streamer: Callable, responder: Callable, model: str, logprobs: bool) -> None:
        async def whole() -> None:
            await request.json(200, responder(await collect(gens), model, logprobs))

        await serve(request, gens, lambda: streamer(request, gens, bool(include_usage), model, logprobs)
                    if stream else whole())

    # ---- chat ------------------------------------------------------------------------------

    @staticmethod
    def _chat_response(outs, model: str, logprobs: bool, shape: AnswerShape = AnswerShape(),
                       legacy: bool = False, predicted: bool = False) -> ChatCompletion:
        """`legacy`: the request sent the deprecated functions, and gets its call as function_call."""
        choices = []
        for i, o in enumerate(outs):
            parts = shape.whole(o.text, o.finish_reason)
            message = AssistantMessage("assistant", parts.content, parts.tool_calls, parts.reasoning)
            reason = parts.finish_reason
            if legacy:
                message, reason = legacy_functions.legacy_message(message, reason)
            choices.append(ChatChoice(i, message, reason, chat_logprobs(o.logprobs) if logprobs else None))
        completion = sum(o.completion_tokens for o in outs)
        details = tuple(map(sum, zip(*map(_details, outs))))
        return ChatCompletion(f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), model, choices,
                              _usage(outs[0].prompt_tokens, completion, outs[0].cached_tokens, details, predicted),
                              system_fingerprint=FINGERPRINT)

    async def _chat_stream(self, request: Request, gens: Generations, include_usage: bool, model: str,
                           logprobs: bool, shape: AnswerShape = AnswerShape(), legacy: bool = False,
                           keep: Keep | None = None, predicted: bool = False) -> None:
        """`keep`: the answer, whole, is stored once every choice has ended (before [DONE])."""
        cid = f"chatcmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        sse = EventStream(request)
        outcomes = Outcomes(len(gens.requests)) if keep is not None else None

        def whole() -> None:
            answer = self._chat_response(outcomes.result(), model, logprobs, shape, legacy, predicted)
            keep(msgspec.structs.replace(answer, id=cid, created=created))
        readers: dict[int, AnswerReader] = {}  # each choice's, unless the text goes out as it is

        def chunk(choices, usage=None) -> ChatCompletionChunk:
            return ChatCompletionChunk(cid, created, model, choices, system_fingerprint=FINGERPRINT, usage=usage)

        held: dict[int, list[TokenLogprob]] = {}  # logprobs of tokens whose text is held back

        def taken(i: int, entries: tuple[TokenLogprob, ...] = ()) -> ChatLogprobs | None:
            """The logprobs a chunk with text carries: those held back, then its own."""
            if not logprobs:
                return None
            return chat_logprobs([*held.pop(i, []), *entries])

        def calls(i: int, deltas: list[CallDelta]) -> list[ChatCompletionChunk]:
            if not deltas:
                return []
            if legacy:  # one call at most: its pieces as delta.function_call
                return [chunk([ChatChunkChoice(i, Delta(function_call=FunctionCallDelta(d.arguments, d.name)))])
                        for d in deltas]
            return [chunk([ChatChunkChoice(i, Delta(tool_calls=[
                ToolCallDelta(d.index, FunctionCallDelta(d.arguments, d.name), d.id, "function" if d.id else None)
                for d in deltas]))])]

        def delta(i: int, ev: TextDelta) -> list[ChatCompletionChunk]:
            if shape.plain:
                return [chunk([ChatChunkChoice(i, Delta(content=ev.text), None, taken(i, ev.logprobs))])]
            if i not in readers:
                readers[i] = shape.reader(stream_calls=True)
            thought, text = readers[i].push(ev.text)
            out = []
            if thought or text:
                out.append(chunk([ChatChunkChoice(i, Delta(content=text or None, reasoning_content=thought or None),
                                                  None, taken(i, ev.logprobs))]))
            else:
                held.setdefault(i, []).extend(ev.logprobs)  # they go with the text when it comes
            return out + calls(i, readers[i].take_calls())

        def final(i: int, reason: str) -> list[ChatCompletionChunk]:
            if shape.plain:
                return [chunk([ChatChunkChoice(i, Delta(), reason)])]
            reader = readers.pop(i, None) or shape.reader(stream_calls=True)
            parts = reader.finish(reason)
            out = []
            if parts.reasoning or parts.content or held.get(i):
                out.append(chunk([ChatChunkChoice(i, Delta(content=parts.content, reasoning_content=parts.reasoning),
                                                  None, taken(i))]))
            reason = legacy_functions.legacy_reason(parts.finish_reason) if legacy else parts.finish_reason
            return out + calls(i, reader.take_calls()) + [chunk([ChatChunkChoice(i, Delta(), reason)])]

        await self._stream(
            sse, gens, include_usage,
            first=lambda i: chunk([ChatChunkChoice(i, Delta(role="assistant", content=""))]),
            delta=delta, final=final, usage=lambda u: chunk([], u),
            seen=outcomes.add if outcomes is not None else None, done=whole if keep is not None else None,
            predicted=predicted,
        )

    # ---- completions -----------------------------------------------------------------------

    @staticmethod
    def _completion_response(outs, model: str, logprobs: bool, echoes: list[tuple[str, bytes]] | None = None,
                             counted=None, per_prompt: int = 1) -> Completion:
        """The completion of `outs` (`counted`: what usage counts, all the candidates of best_of,
        `per_prompt` of them for each prompt: a prompt counts once however many it has)."""
        choices = []
        for i, o in enumerate(outs):
            echoed = Echo(echoes[i][1], o.prompt_logprobs) if echoes and o.prompt_logprobs is not None else None
            choices.append(CompletionChoice(i, (echoes[i][0] if echoes else "") + o.text, o.finish_reason,
                                            completion_logprobs(o.logprobs, echoed) if logprobs else None))
        counted = outs if counted is None else counted
        prompt = sum(o.prompt_tokens for o in counted[::per_prompt])
        completion = sum(o.completion_tokens for o in counted)
        cached = sum(o.cached_tokens for o in counted[::per_prompt])
        return Completion(f"cmpl-{uuid.uuid4().hex}", int(time.time()), model, choices,
                          system_fingerprint=FINGERPRINT, usage=_usage(prompt, completion, cached))

    async def _completion_stream(self, request: Request, gens: Generations, include_usage: bool, model: str,
                                 logprobs: bool, echoes: list[tuple[str, bytes]] | None = None,
                                 choices: int = 1) -> None:
        cid = f"cmpl-{uuid.uuid4().hex}"
        created = int(time.time())
        sse = EventStream(request)

        def chunk(choices, usage=None) -> Completion:
            return Completion(cid, created, model, choices, system_fingerprint=FINGERPRINT, usage=usage)

        ends: dict[int, int] = {}  # each choice's text offset after its chunks so far

        def at(i: int, entries, echoed: Echo | None = None) -> CompletionLogprobs:
            """A chunk's logprobs, their offsets counted from the choice's start."""
            lp = completion_logprobs(entries, echoed, ends.get(i, 0))
            if lp.tokens:
                ends[i] = lp.text_offset[-1] + len(lp.tokens[-1])
            return lp

        def echo(i: int, ev: PromptScored) -> list[Completion]:
            """The echoed prompt's chunk, scored, for each choice of the prompt (its first scores it)."""
            return [chunk([CompletionChoice(j, echoes[j][0], None, at(j, (), Echo(echoes[j][1], ev.logprobs)))])
                    for j in range(i, i + choices)]

        await self._stream(
            sse, gens, include_usage,
            # echo without logprobs: the prompt's text goes first; with them, when it is scored
            first=(lambda i: chunk([CompletionChoice(i, echoes[i][0], None)])) if echoes and not logprobs else None,
            scored=echo if echoes and logprobs else None,
            delta=lambda i, ev: [chunk([CompletionChoice(i, ev.text, None, at(i, ev.logprobs) if logprobs else None)])],
            final=lambda i, reason: [chunk([CompletionChoice(i, "", reason)])],
            usage=lambda u: chunk([], u), per_prompt=choices,
        )

    # ---- shared streaming loop -------------------------------------------------------------

    @staticmethod
    async def _stream(sse: EventStream, gens: Generations, include_usage: bool, *, first, delta, final, usage,
                      scored=None, seen: Callable[[int, object], None] | None = None,
                      done: Callable[[], None] | None = None, per_prompt: int = 0, predicted: bool = False) -> None:
        """Relay events as SSE; a failure before the first byte keeps its HTTP status. `seen`
        sees every event; `done` runs once every sequence has ended well, before [DONE].
        `per_prompt`: the sequences of each prompt, in order (0: they all have the one prompt),
        so that usage counts each prompt once."""
        opened: set[int] = set()
        prompt_tokens: dict[int, tuple[int, int]] = {}  # (prompt, cached) per prompt, as its first sequence has it
        completion = 0
        details = (0, 0, 0)
        try:
            async for i, ev in gens.events():
                if isinstance(ev, Failed):
                    err = failure_error(ev)
                    if not sse.started:
                        raise err
                    await sse.raw(b"data: " + err.body() + b"\n\n")
                    gens.cancel()
                    break
                if seen is not None:
                    seen(i, ev)
                if first is not None and i not in opened:
                    opened.add(i)
                    await sse.event(first(i))
                if isinstance(ev, TextDelta):
                    for out in delta(i, ev):  # none: held back (a tag's start, blanks)
                        await sse.event(out)
                elif isinstance(ev, PromptScored):
                    for out in scored(i, ev) if scored is not None else ():
                        await sse.event(out)
                elif isinstance(ev, Finished):
                    # each prompt's count as its first sequence has it, as a whole answer counts it
                    # (the others copied its prompt: their cached count differs), whichever ends first
                    slot, lead = (i // per_prompt, i % per_prompt == 0) if per_prompt else (0, i == 0)
                    if lead or slot not in prompt_tokens:
                        prompt_tokens[slot] = (ev.prompt_tokens, ev.cached_tokens)
                    completion += ev.completion_tokens
                    details = tuple(a + b for a, b in zip(details, _details(ev)))
                    for out in final(i, ev.reason):
                        await sse.event(out)
            else:
                if include_usage:
                    prompt, cached = map(sum, zip(*prompt_tokens.values())) if prompt_tokens else (0, 0)
                    await sse.event(usage(_usage(prompt, completion, cached, details, predicted)))
                if done is not None:
                    done()
            await sse.raw(b"data: [DONE]\n\n")
            await sse.close()
        except OSError:  # client went away mid-stream
            gens.cancel()


def _kept(answer: ChatCompletion, keep: Keep | None) -> ChatCompletion:
    """The answer, stored first where its request asked (`store: true`)."""
    if keep is not None:
        keep(answer)
    return answer


def _candidates(req: CompletionRequest) -> int:
    """How many completions each prompt gets generated: best_of (at least n, not streamed), else n."""
    if req.best_of is None or req.best_of == req.n:
        return req.n
    if req.best_of < req.n:
        raise bad_request(f"best_of ({req.best_of}) must be at least n ({req.n})", param="best_of")
    if req.stream:
        raise bad_request("best_of cannot be streamed: the best are known once all are done", param="best_of")
    return req.best_of


def best_of(outs: list, candidates: int, n: int) -> list[int]:
    """Of each prompt's `candidates` consecutive outputs, the indices of the `n` with the highest
    mean token log-probability, best first (all of them, in order, when there is no choice)."""
    if candidates == n:
        return list(range(len(outs)))
    kept: list[int] = []
    for start in range(0, len(outs), candidates):
        block = range(start, start + candidates)
        ranked = sorted(block, key=lambda k: -outs[k].mean_logprob if outs[k].mean_logprob is not None else math.inf)
        kept += ranked[:n]
    return kept
