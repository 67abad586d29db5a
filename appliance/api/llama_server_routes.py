"""llama-server's own endpoints, for the clients written against it: POST /completion (a prompt
completed) and POST /infill (fill-in-the-middle, as code editors' plugins such as llama.vim and
llama.vscode call it: the text before and after the cursor, other files as extra context; the
prompt is built by api/infill.py), both in llama-server's own answer shape (`content`,
`stop_type`, `timings`, ...; streamed as `data:` lines of partial results, the last one whole);
GET /props (a model's properties, `?model=`; without it, a router's, as llama-server answers when
it serves several models) and POST /apply-template (a chat's prompt text)."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import replace
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from llama_cpp import __version__ as llama_cpp_version

from .. import __version__
from ..config import Config, ModelConfig
from ..engine.adapters import BASE
from ..engine.client import Generations, PromptError, fit_max_tokens
from ..engine.manager import ModelManager
from ..engine.runner import Failed, Finished, GenerationRequest, ModelRunner, TextDelta
from .errors import ApiError, bad_request, decoded, with_param_renamed
from .generation import (ENGINE_ERRORS, chat_prompt_text, chosen_adapters, deadline, engine_error, failure_error,
                         generation_runner, request_sampling, resolve_runner, serve, stop_list, token_lists)
from .http import EventStream, Request
from .infill import InfillPrompt, infill_prompt
from .schemas import ChatRequest, LoraScale, Probability, SamplingFields, Temperature


class InfillChunk(Struct, frozen=True, kw_only=True):
    text: str
    filename: str = "tmp"


class LlamaServerSampling(SamplingFields, frozen=True, kw_only=True):
    """llama-server's sampling defaults where a request leaves them out (its clients, as
    llama.vim, send none), not OpenAI's flat ones."""

    temperature: Temperature = 0.8
    top_k: Annotated[int, Meta(ge=0, le=1_000_000)] = 40
    top_p: Probability = 0.95
    min_p: Probability = 0.05
    ignore_eos: bool = False  # no end-of-generation token is sampled: the answer runs to n_predict
    # llama-server's token probabilities and ids: not given here (a 400 rather than dropped)
    n_probs: Annotated[int, Meta(ge=0, le=100)] = 0
    return_tokens: bool = False


class InfillRequest(LlamaServerSampling, frozen=True, kw_only=True):
    input_prefix: str
    input_suffix: str
    input_extra: Annotated[list[InfillChunk], Meta(max_length=256)] = []
    prompt: str = ""  # text already typed in the gap (after the prefix)
    n_predict: Annotated[int, Meta(ge=-1, le=1_048_576)] | None = None  # llama-server's name; -1: up to the context
    max_tokens: Annotated[int, Meta(ge=1, le=1_048_576)] | None = None


class Timings(Struct, frozen=True):
    prompt_n: int
    prompt_ms: float
    prompt_per_token_ms: float
    prompt_per_second: float
    predicted_n: int
    predicted_ms: float
    predicted_per_token_ms: float
    predicted_per_second: float
    cache_n: int


class NativeCompletionRequest(LlamaServerSampling, frozen=True, kw_only=True):
    prompt: str | Annotated[list[int], Meta(min_length=1)]  # text, or token ids
    n_predict: Annotated[int, Meta(ge=-1, le=1_048_576)] | None = None  # -1: up to the context
    max_tokens: Annotated[int, Meta(ge=1, le=1_048_576)] | None = None


class AppliedTemplate(Struct, frozen=True):
    prompt: str  # the chat as the model's template renders it (special tokens as text)


class CompletionResult(Struct, frozen=True, kw_only=True, omit_defaults=True):
    index: int = 0
    content: str
    tokens: list[int] = []
    id_slot: int = -1
    stop: bool
    model: str | None = None
    tokens_predicted: int
    tokens_evaluated: int
    has_new_line: bool | None = None
    truncated: bool | None = None
    stop_type: Literal["none", "eos", "word", "limit"] | None = None
    stopping_word: str | None = None
    tokens_cached: int | None = None
    timings: Timings | None = None


BUILD_INFO = f"eie {__version__} (llama-cpp-python {llama_cpp_version})"
_chat_decoder = msgspec.json.Decoder(ChatRequest)
_infill_decoder = msgspec.json.Decoder(InfillRequest)
_completion_decoder = msgspec.json.Decoder(NativeCompletionRequest)
_lora_list_decoder = msgspec.json.Decoder(list[LoraScale])


_N_PREDICT = ((re.compile(r"^max_tokens$"), "n_predict"),)


def _requested(n_predict: int | None, max_tokens: int | None) -> int | None:
    """The answer's token limit: llama-server's `n_predict` (-1: up to the context), else `max_tokens`."""
    if n_predict is not None:
        return n_predict if n_predict >= 0 else None
    return max_tokens


def _prefill_end(ev: Finished, first_text: float | None, t0: float, end: float) -> float:
    """When the prompt's prefill ended: its first token's sampling (its text may have come later,
    or never, eaten by a stop string), bounded to the request's own span."""
    at = ev.first_token_at if ev.first_token_at is not None else first_text or end
    return min(max(at, t0), end)


def _timings(prompt: int, cached: int, predicted: int, t0: float, first: float, end: float) -> Timings:
    prompt_ms, predicted_ms = (first - t0) * 1000, (end - first) * 1000
    computed = max(prompt - cached, 0)
    return Timings(computed, prompt_ms, prompt_ms / max(computed, 1), computed / max(prompt_ms / 1000, 1e-9),
                         predicted, predicted_ms, predicted_ms / max(predicted, 1),
                         predicted / max(predicted_ms / 1000, 1e-9), cached)


class LlamaServerRoutes:
    def __init__(self, config: Config, manager: ModelManager):
        self.config = config
        self.manager = manager

    async def infill(self, request: Request) -> None:
        try:
            await self._infill(request)
        except ENGINE_ERRORS as e:
            raise engine_error(e) from None

    async def completion(self, request: Request) -> None:
        try:
            await self._completion(request)
        except ENGINE_ERRORS as e:
            raise engine_error(e) from None

    async def _infill(self, request: Request) -> None:
        limits = self.config.server.limits
        req: InfillRequest = decoded(_infill_decoder, await request.body(limits.max_body_bytes))
        runner = await self._runner(req, request)
        requested = _requested(req.n_predict, req.max_tokens)
        prompt: InfillPrompt = await asyncio.to_thread(
            infill_prompt, runner.vocab, req.input_prefix, req.input_suffix,
            extra=[(c.filename, c.text) for c in req.input_extra], typed=req.prompt, n_ctx=runner.n_ctx,
            # (the room kept for the answer; a larger n_predict ends where the context does)
            max_tokens=min(requested, runner.n_ctx // 2) if requested
            else min(limits.max_tokens or runner.n_ctx, runner.n_ctx // 4), param="input_suffix")
        await self._generate(request, runner, req, prompt, requested, "input_prefix")

    async def _completion(self, request: Request) -> None:
        req: NativeCompletionRequest = decoded(_completion_decoder,
                                               await request.body(self.config.server.limits.max_body_bytes))
        runner = await self._runner(req, request)
        if isinstance(req.prompt, str):
            tokens = await asyncio.to_thread(runner.vocab.tokenize, req.prompt, add_special=True, parse_special=True)
        else:
            tokens = token_lists(runner.vocab, req.prompt, "prompt", 1)[0]
        await self._generate(request, runner, req, InfillPrompt(tokens, False), _requested(req.n_predict, req.max_tokens),
                             "prompt")

    async def props(self, request: Request) -> None:
        name = request.query("model")
        if not name:  # llama-server's router answers so when it serves several models
            await request.json(200, {"role": "router", "model_alias": "eie", "model_path": "none",
                                     "default_generation_settings": {"params": {}, "n_ctx": 0},
                                     "build_info": BUILD_INFO, "models": [m.name for m in self.config.models]})
            return
        runner = await resolve_runner(self.manager, name)
        defaults = msgspec.to_builtins(NativeCompletionRequest(model=name, prompt=""))
        params = {k: v for k, v in defaults.items() if k not in ("model", "prompt") and v is not None}
        params.update(n_predict=-1, seed=-1)
        vocab = runner.vocab
        await request.json(200, {
            "default_generation_settings": {"params": params, "n_ctx": runner.n_ctx},
            "total_slots": runner.cfg.n_parallel, "model_alias": runner.name, "model_path": str(self.config.model_path(runner.cfg)),
            "modalities": {"vision": False, "video": False, "audio": False},
            "chat_template": runner.template.source, "bos_token": vocab.bos_text, "eos_token": vocab.eos_text,
            "build_info": BUILD_INFO, "is_sleeping": False, "endpoint_slots": False, "endpoint_props": False,
            "endpoint_metrics": True})

    async def lora_adapters(self, request: Request) -> None:
        """llama-server's GET /lora-adapters for ?model= (a model, or one of its adapters' names):
        the model's adapters by the id a request's `lora` names them with, each at the scale that
        name serves it at (0: not applied; a model's own name applies none unless POST gave it some)."""
        name, cfg = self._adapters_model(request)
        await request.json(200, self._adapter_list(name, cfg))

    async def set_lora_adapters(self, request: Request) -> None:
        """llama-server's POST /lora-adapters: `[{id, scale}]` becomes the set ?model= serves (the
        listed adapters at those scales, the others off), until a reload changes the adapters; a
        request's own `lora` still replaces it."""
        name, cfg = self._adapters_model(request)
        items = decoded(_lora_list_decoder, await request.body(self.config.server.limits.max_body_bytes))
        self.manager.set_lora(name, chosen_adapters(cfg, items, ""))
        await request.json(200, {"success": True, "model": name, "adapters": self._adapter_list(name, cfg)})

    def _adapters_model(self, request: Request) -> tuple[str, ModelConfig]:
        """?model= (a model's or an adapter's name) and the configured model it belongs to."""
        name = request.query("model")
        if not name:
            raise bad_request("model: required (?model=), the model whose adapters these are", param="model")
        config = self.manager.config
        cfg = config.model(config.base_of(name))
        if cfg is None:
            raise ApiError(404, f"model '{name}' does not exist", param="model", code="model_not_found")
        return name, cfg

    def _adapter_list(self, name: str, cfg: ModelConfig) -> list[dict]:
        """`cfg`'s adapters, each at the scale `name` serves it at (0: off)."""
        _, chosen = self.manager.adapter_target(name) or (name, BASE)
        scales = dict(chosen)
        return [{"id": i, "name": a.name, "path": str(self.manager.config.adapter_path(a)), "scale": scales.get(i, 0.0)}
                for i, a in enumerate(cfg.lora)]

    async def apply_template(self, request: Request) -> None:
        req: ChatRequest = decoded(_chat_decoder, await request.body(self.config.server.limits.max_body_bytes))
        runner = await generation_runner(self.manager, req.model, req.lora)
        try:
            text = await chat_prompt_text(runner, req)
        except ENGINE_ERRORS as e:
            raise engine_error(e) from None
        await request.json(200, AppliedTemplate(text))

    async def _runner(self, req: SamplingFields, request: Request) -> ModelRunner:
        if req.n != 1:
            raise bad_request("llama-server's endpoints give one answer: n must be 1", param="n")
        return await generation_runner(self.manager, req.model, req.lora, request if req.stream else None)

    async def _generate(self, request: Request, runner: ModelRunner, req: InfillRequest | NativeCompletionRequest,
                        prompt: InfillPrompt, requested: int | None, param: str) -> None:
        limits = self.config.server.limits
        for field in ("n_probs", "return_tokens"):
            if getattr(req, field):
                raise bad_request(f"{field} is not served here: /v1/completions gives logprobs (and top_logprobs)",
                                  param=field)
        if req.seed == -1:  # llama-server's "a random seed" (elsewhere -1 is a seed like any other)
            req = msgspec.structs.replace(req, seed=None)
        params = await request_sampling(req, runner.vocab)
        if req.ignore_eos:
            params = replace(params, logit_bias={**params.logit_bias,
                                                 **{t: float("-inf") for t in runner.vocab.eog_tokens}})
        room = runner.n_ctx - len(prompt.tokens)
        if requested is not None and room > 0:
            requested = min(requested, room)  # as llama-server: up to the context's end (stop_type "limit")
        try:
            max_tokens = fit_max_tokens(runner.n_ctx, len(prompt.tokens), requested, None, limits.max_tokens, param,
                                        limits.max_prompt_tokens)
        except PromptError as e:  # (the server's max_tokens cap) named as the request named it
            raise with_param_renamed(engine_error(e), _N_PREDICT if req.n_predict is not None else ()) from None
        gens = Generations(runner, [GenerationRequest(prompt.tokens, max_tokens, params, stop_list(req),
                                                      deadline(self.config), speculative=req.speculative)])
        await serve(request, gens, lambda: self._answer(request, gens, req, prompt))

    async def _answer(self, request: Request, gens: Generations, req: InfillRequest | NativeCompletionRequest,
                      prompt: InfillPrompt) -> None:
        t0 = time.monotonic()
        first: float | None = None
        parts: list[str] = []
        sse = EventStream(request) if req.stream else None
        async for _, ev in gens.events():
            if isinstance(ev, TextDelta):
                first = first or time.monotonic()
                parts.append(ev.text)
                if sse is not None:  # a piece of text (tokens whose text was held back come together)
                    await sse.event(CompletionResult(content=ev.text, stop=False, tokens_predicted=ev.generated,
                                                 tokens_evaluated=len(prompt.tokens)))
            elif isinstance(ev, Finished):
                end = time.monotonic()
                text = "".join(parts)
                stop_type = "limit" if ev.reason == "length" else "word" if ev.stop_string else "eos"
                result = CompletionResult(
                    content="" if sse is not None else text, stop=True, model=req.model,
                    tokens_predicted=ev.completion_tokens, tokens_evaluated=ev.prompt_tokens,
                    has_new_line="\n" in text, truncated=prompt.truncated, stop_type=stop_type,
                    stopping_word=ev.stop_string or "", tokens_cached=ev.cached_tokens,
                    timings=_timings(ev.prompt_tokens, ev.cached_tokens, ev.completion_tokens, t0,
                                     _prefill_end(ev, first, t0, end), end))
                if sse is None:
                    await request.json(200, result)
                else:
                    await sse.event(result)
                    await sse.close()
                return
            elif isinstance(ev, Failed):
                err = failure_error(ev)
                if sse is None or not sse.started:
                    raise err
                await sse.raw(b"data: " + err.body() + b"\n\n")
                await sse.close()
                return
