"""From an API request to engine sequences: model lookup, sampling, prompts, and engine errors as HTTP."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from contextlib import contextmanager
from typing import Any, Awaitable, Callable, Iterator

from ..config import Config, ModelConfig
from ..engine.client import GenerationFailed, Generations, PromptError, chat_text, render_chat
from ..observability import context
from ..engine.manager import InsufficientMemory, ModelBusy, ModelManager, PolicyRefused
from ..engine.adapted_runner import AdaptedRunner
from ..engine.adapters import AdapterSet
from ..engine.runner import Failed, ModelRunner, NotReady, QueueFull
from ..policy import PluginError
from ..engine import grammar, reasoning
from ..engine.chat_template import RESERVED
from ..engine.grammar import GrammarError
from ..engine.native import Vocab
from ..engine.sampling import SamplingParams, seed32
from ..engine.speculative.ngram import PredictionIndex
from ..engine.schema_grammar import SchemaError, json_object_gbnf, schema_to_gbnf
from . import legacy_functions, native_tools, tools
from .chat_answer import AnswerShape
from .errors import ApiError, bad_request
from .http import EventStream, Request
from .infill import infill_prompt
from .schemas import ChatMessage, ChatRequest, CompletionRequest, LoraScale, SamplingOptions, TextPart
from .tools import ToolPlan

RETRY_AFTER = [(b"retry-after", b"1")]


async def generation_runner(manager: ModelManager, name: str, lora: list[LoraScale] | None = None,
                            sse: Request | None = None) -> ModelRunner:
    """resolve_runner for a request that generates: an embedding model is a 400. `lora` is
    llama-server's per-request adapter list (request_adapters); `sse`: a request answered by SSE,
    which gets keep-alives while the model loads on demand."""
    runner = await resolve_runner(manager, name, sse)
    if runner.cfg.embedding:
        raise bad_request(f"model '{name}' is an embedding model: it serves /v1/embeddings only", param="model")
    return request_adapters(runner, lora) if lora is not None else runner


def request_adapters(runner: ModelRunner, lora: list[LoraScale]) -> ModelRunner:
    """The runner decoding with the adapters `lora` names: [{id, scale}] over the model's
    models[].lora by index, as llama-server takes them; unlisted adapters are off, and the set
    replaces the one the model name gave (an adapter's name is its model with that adapter)."""
    base = runner.base if isinstance(runner, AdaptedRunner) else runner
    return AdaptedRunner(base, runner.name, chosen_adapters(base.cfg, lora, "lora"))


def chosen_adapters(cfg: ModelConfig, lora: list[LoraScale], field: str) -> AdapterSet:
    """llama-server's [{id, scale}] over `cfg`'s adapters as a set (unlisted ones and scale 0 are
    off); an unknown or repeated id is a 400 naming `<field>[i].id`."""
    adapters = cfg.lora
    chosen: dict[int, float] = {}
    for i, item in enumerate(lora):
        if item.id >= len(adapters):
            have = f"ids 0..{len(adapters) - 1}" if adapters else "none (models[].lora)"
            raise bad_request(f"{field}[{i}].id: model '{cfg.name}' has no adapter {item.id} (it has {have})",
                              param=f"{field}[{i}].id")
        if item.id in chosen:
            raise bad_request(f"{field}[{i}].id: adapter {item.id} is listed twice", param=f"{field}[{i}].id")
        chosen[item.id] = float(item.scale)
    return tuple(sorted((i, s) for i, s in chosen.items() if s))


async def resolve_runner(manager: ModelManager, name: str, sse: Request | None = None) -> ModelRunner:
    """The model's runner, ready to take requests (loaded first if the strategy loads on demand;
    `sse`: a request answered by SSE, whose stream opens now so that a long load gets keep-alives)."""
    try:
        if sse is not None and not manager.is_ready(name):
            EventStream(sse)  # the route's own stream takes it over
        runner = await manager.ready_runner(name)
        req = context.info()
        if req is not None:
            if not req.keep_alive_said:  # a request without keep_alive: the strategy's again (Ollama's too)
                manager.ask_keep_alive(runner.base.name if isinstance(runner, AdaptedRunner) else runner.name, None)
            req.add_model(runner.name)
            if not req.ended:
                req.releases.append(manager.hold_runner(runner))
        return runner
    except KeyError:
        raise ApiError(404, f"model '{name}' does not exist", param="model", code="model_not_found") from None
    except NotReady as e:
        headers = RETRY_AFTER if str(e) == "loading" else []
        raise ApiError(503, f"model '{name}' is not available: {e}", type="service_unavailable", param="model",
                       code="model_not_ready", headers=headers) from None
    except (PolicyRefused, InsufficientMemory, TimeoutError, PluginError) as e:
        raise manager_error(e) from None


def manager_error(e: Exception) -> ApiError:
    if isinstance(e, PolicyRefused):
        return ApiError(409, str(e), type="invalid_request_error", code="policy_refused")
    if isinstance(e, ModelBusy):
        return ApiError(409, str(e), type="invalid_request_error", code="model_busy")
    if isinstance(e, InsufficientMemory):
        return ApiError(507, str(e), type="insufficient_storage", code="insufficient_memory")
    if isinstance(e, PluginError):
        return ApiError(500, str(e), type="server_error", code="policy_plugin_error")
    if isinstance(e, TimeoutError):
        return ApiError(503, "the model did not load in time", type="service_unavailable", code="load_timeout")
    raise e


def sampling_params(req: SamplingOptions, n_vocab: int, with_grammar: bool = True) -> SamplingParams:
    """`with_grammar` false: the caller sets the grammar (a tool plan's, which holds the
    response_format's already), so the format's schema is not converted a second time."""
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
        grammar=grammar_text(req) if with_grammar else None,
        temperature=req.temperature,
        top_k=req.top_k,
        top_p=req.top_p,
        min_p=req.min_p,
        repeat_penalty=req.repeat_penalty,
        presence_penalty=req.presence_penalty,
        frequency_penalty=req.frequency_penalty,
        seed=None if req.seed is None else seed32(req.seed),
        logit_bias=bias,
        penalty_last_n=req.repeat_last_n,
        dry_multiplier=req.dry_multiplier,
        dry_base=req.dry_base,
        dry_allowed_length=req.dry_allowed_length,
        dry_penalty_last_n=req.dry_penalty_last_n,
        **({"dry_sequence_breakers": tuple(req.dry_sequence_breakers)} if req.dry_sequence_breakers is not None else {}),
        top_n_sigma=req.top_n_sigma,
        typical_p=req.typical_p,
        xtc_probability=req.xtc_probability,
        xtc_threshold=req.xtc_threshold,
        dynatemp_range=req.dynatemp_range,
        dynatemp_exponent=req.dynatemp_exponent,
        mirostat=req.mirostat,
        mirostat_tau=req.mirostat_tau,
        mirostat_eta=req.mirostat_eta,
    )


def grammar_text(req: SamplingOptions) -> str | None:
    """The GBNF grammar the output must follow (response_format or grammar), or None."""
    fmt = req.response_format
    kind = fmt.type if fmt is not None else "text"
    if req.grammar is not None:
        if kind != "text":
            raise bad_request("grammar and a response_format other than text both constrain the output; "
                              "send one", param="grammar")
        return req.grammar
    if kind == "text":
        return None
    if kind == "json_object":
        return json_object_gbnf() if fmt.schema is None else _schema_grammar(fmt.schema, "response_format.schema")
    if kind == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema is None:
            raise bad_request("response_format type json_schema needs json_schema.schema",
                              param="response_format.json_schema.schema")
        return _schema_grammar(fmt.json_schema.schema, "response_format.json_schema.schema")
    raise bad_request(f"response_format.type {kind!r} is not one of text, json_object, json_schema",
                      param="response_format.type")


def _schema_grammar(schema: object, param: str) -> str:
    try:
        return schema_to_gbnf(schema)
    except SchemaError as e:
        where = f"{param}.{e.path}" if e.path else param
        raise bad_request(f"{where}: {e.reason}", param=where) from None


async def request_sampling(req: SamplingOptions, vocab: Vocab | None, tool_plan: ToolPlan | None = None) -> SamplingParams:
    """The request's sampling parameters. A grammar (response_format, grammar, or the one tools
    need) is converted and compiled once by llama.cpp for this vocabulary (None: a group's
    several, where a token named by its text cannot compile), off the event loop: a large schema
    takes milliseconds."""
    n_vocab = vocab.n_vocab if vocab is not None else 0
    fmt = req.response_format
    if req.grammar is None and tool_plan is None and (fmt is None or fmt.type == "text"):
        return sampling_params(req, n_vocab)

    def compiles(text: str, field: str) -> None:
        try:
            grammar.check(vocab, text)
        except GrammarError as e:
            raise bad_request(str(e), param=field) from None

    def build() -> SamplingParams:
        params = sampling_params(req, n_vocab, with_grammar=tool_plan is None)
        own = tool_plan is not None and req.grammar is not None  # the request's grammar beside tools
        if tool_plan is not None:
            params = replace(params, grammar=tool_plan.grammar, grammar_triggers=tool_plan.triggers,
                             shown_tokens=tool_plan.shown_tokens)
            if own and not tool_plan.reply:  # for a later turn: not part of this turn's grammar
                compiles(req.grammar, "grammar")
        try:
            grammar.check(vocab, params.grammar)
        except GrammarError as e:
            if own:  # a reply's grammar at fault is named, not the tools
                compiles(req.grammar, "grammar")
            field = "tools" if tool_plan is not None else "grammar" if req.grammar is not None else "response_format"
            raise bad_request(str(e), param=field) from None
        return params

    return await asyncio.to_thread(build)


def stop_list(req: SamplingOptions) -> list[str]:
    if req.stop is None:
        return []
    return [req.stop] if isinstance(req.stop, str) else list(req.stop)


def content_text(content: str | list[TextPart] | None, param: str) -> str:
    """A message's (or a prediction's) content as text: a string, or text parts joined; another
    kind of part is a 400 naming it (`param`: where the content is)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = []
    for j, part in enumerate(content):
        field = {"text": "text", "refusal": "refusal"}.get(part.type)
        if field is None:
            raise bad_request(f"content part type {part.type!r} is not supported (text only)",
                              param=f"{param}[{j}].type")
        value = getattr(part, field)
        if value is None:
            raise bad_request(f"a {part.type} part needs its {field} as a string", param=f"{param}[{j}].{field}")
        parts.append(value)
    return "".join(parts)


def template_kwargs(configured: dict[str, Any], requested: dict[str, Any] | None) -> dict[str, Any]:
    """The chat template's extra variables: the model's, with the request's laid over them; a
    variable the server sets itself is a 400 naming it."""
    for key in requested or {}:
        if key in RESERVED:
            raise bad_request(f"chat_template_kwargs may not set {key!r}: the server sets it",
                              param=f"chat_template_kwargs.{key}")
    return {**configured, **(requested or {})}


async def chat_prompt(runner: ModelRunner, req: ChatRequest) -> tuple[list[int], ToolPlan | None]:
    """The prompt tokens of a chat request, as `/v1/chat/completions` renders it and `/tokenize`
    shows it (tools in the model's own format or EIE's, template variables), and its tool plan.
    Raises PromptError when the template cannot render the messages."""
    prompt, plan = await _rendered(runner, req, render_chat)
    return prompt, plan


async def chat_prompt_text(runner: ModelRunner, req: ChatRequest) -> str:
    """The text chat_prompt tokenizes (llama-server's /apply-template)."""
    text, _ = await _rendered(runner, req, chat_text)
    return text


def refuse_unsupported(req: ChatRequest) -> None:
    """A 400 naming a field of OpenAI's that this server cannot honour."""
    if req.audio is not None or any(m != "text" for m in req.modalities or ()):
        raise bad_request("audio output is not supported: text only", param="audio" if req.audio is not None else "modalities")
    if req.web_search_options is not None:
        raise bad_request("web search is not available on this server", param="web_search_options")


async def _rendered(runner: ModelRunner, req: ChatRequest, render: Callable) -> tuple[Any, ToolPlan | None]:
    refuse_unsupported(req)
    req, _ = legacy_functions.as_tools(req)  # where the chat route has not already
    native = native_tools.format_of(runner.template, runner.vocab)
    budget = reasoning.budget_tokens(runner.cfg, req.thinking_budget_tokens, req.reasoning_effort)

    def tool_plan() -> ToolPlan | None:  # a direct answer follows the response_format or grammar, if any
        return tools.plan(req, native, budget, grammar_text(req))

    # a large schema takes milliseconds: off the loop
    plan = await asyncio.to_thread(tool_plan) if req.tools else tools.plan(req)
    messages = tools.conversation(plain_messages(req.messages), req.messages, plan, native)
    extra = {**reasoning.budget_kwargs(runner.template.source, budget),
             **template_kwargs(runner.cfg.chat_template_kwargs, thinking_kwargs(req))}
    if req.continue_final_message:
        final = req.messages[-1]
        if final.role != "assistant" or final.tool_calls or final.function_call:
            raise bad_request("the answer to go on from must be the last message, the assistant's text",
                              param="continue_final_message")
        if plan is not None and native is None:  # EIE's tool format writes the assistant's text as JSON
            raise bad_request(f"an answer begun (a last assistant message to go on from) cannot be combined "
                              f"with tools for model '{runner.name}', whose tool calls are EIE's JSON",
                              param="continue_final_message")
    return await asyncio.to_thread(render, runner, messages, plan.template_tools if plan else None, extra,
                                   req.continue_final_message), plan


async def chat_answer_plan(runner: ModelRunner, req: ChatRequest) -> tuple[list[int], SamplingParams, AnswerShape]:
    """A chat request's prompt tokens, sampling parameters (its tools' grammar included) and the
    shape its answer is read in (think block, tool calls)."""
    prompt, plan = await chat_prompt(runner, req)
    params = await request_sampling(req, runner.vocab, plan)
    think, inside = reasoning.for_answer(runner, req.reasoning_format, prompt)
    budget = reasoning.budget_tokens(runner.cfg, req.thinking_budget_tokens, req.reasoning_effort)
    if req.response_format is not None and req.response_format.type != "text" and (plan is None or plan.reply):
        params = reasoning.think_first(runner, prompt, params, budget)
    params = reasoning.with_budget(runner, prompt, params, budget)
    return prompt, params, AnswerShape(plan, think, inside)


async def prediction_index(runner: ModelRunner, req: ChatRequest) -> PredictionIndex | None:
    """The request's `prediction`, tokenized and indexed for the speculator (None: none given),
    its first n_ctx tokens (an answer is no longer than that)."""
    if req.prediction is None:
        return None
    text = content_text(req.prediction.content, "prediction.content")
    if not text:
        return None

    def index() -> PredictionIndex:
        tokens = runner.vocab.tokenize(text, add_special=False, parse_special=False)
        return PredictionIndex(tokens[: runner.n_ctx])

    return await asyncio.to_thread(index)


def thinking_kwargs(req: ChatRequest) -> dict[str, Any] | None:
    """The request's template variables, with `reasoning_effort` as `enable_thinking`
    (reasoning.effort_kwargs) under its own."""
    if req.reasoning_effort is None:
        return req.chat_template_kwargs
    return {**reasoning.effort_kwargs(req.reasoning_effort), **(req.chat_template_kwargs or {})}


def plain_messages(messages: list[ChatMessage]) -> list[dict[str, str]]:
    """Messages as the chat templates take them: text content, developer folded into system."""
    return [
        {"role": "system" if m.role == "developer" else m.role, "content": content_text(m.content, f"messages[{i}].content")}
        for i, m in enumerate(messages)
    ]


def completion_prompts(runner: ModelRunner, req: CompletionRequest) -> list[list[int]]:
    """Token lists for each prompt (blocking: run it off the event loop); with a `suffix`, each
    (text) prompt and the suffix around the gap the answer fills (api/infill.py)."""
    if req.max_tokens == 0 and not req.echo:
        raise bad_request("max_tokens 0 asks for no answer: it is allowed only with echo", param="max_tokens")
    if not req.suffix:
        return token_lists(runner.vocab, req.prompt, "prompt", 16)
    if req.echo:
        raise bad_request("echo is not supported with suffix", param="echo")
    texts = [req.prompt] if isinstance(req.prompt, str) else req.prompt
    if not texts or len(texts) > 16 or not all(isinstance(t, str) for t in texts):
        raise bad_request("with suffix, prompt must be a string or a list of at most 16 strings", param="prompt")
    return [infill_prompt(runner.vocab, t, req.suffix, n_ctx=runner.n_ctx, max_tokens=req.max_tokens or 16,
                          param="suffix").tokens for t in texts]


def token_lists(vocab: Vocab, p: str | list, param: str, most: int) -> list[list[int]]:
    """Token lists for OpenAI's prompt or input forms: a string, a list of strings, a list of token
    ids or a list of token-id lists (at most `most` of them); strings as the tokenizer adds BOS."""
    if isinstance(p, str):
        return [vocab.tokenize(p, add_special=True, parse_special=False)]
    if not p:
        raise bad_request(f"{param} must not be empty", param=param)
    if all(isinstance(x, int) and not isinstance(x, bool) for x in p):
        return [_token_ids(p, vocab.n_vocab, param)]
    if len(p) > most and (all(isinstance(x, str) for x in p) or all(isinstance(x, list) for x in p)):
        raise bad_request(f"at most {most} {param}s per request", param=param)
    if all(isinstance(x, str) for x in p):
        return [vocab.tokenize(x, add_special=True, parse_special=False) for x in p]
    if all(isinstance(x, list) for x in p):
        return [_token_ids(x, vocab.n_vocab, f"{param}[{i}]") for i, x in enumerate(p)]
    raise bad_request(f"{param} must be a string, a list of strings, a list of token ids or a list of token-id lists",
                      param=param)


def _token_ids(ids: list[int], n_vocab: int, param: str) -> list[int]:
    if not ids:
        raise bad_request("a list of token ids must not be empty", param=param)
    for x in ids:
        if not 0 <= x < n_vocab:
            raise bad_request(f"token id {x} is outside the vocabulary (0..{n_vocab - 1})", param=param)
    return list(ids)


def echo_texts(runner: ModelRunner, req: CompletionRequest, prompts: list[list[int]]) -> list[str]:
    """What `echo` puts before each answer: a prompt given as text as it was given, one given as
    token ids as those tokens read (the pieces logprobs name)."""
    if isinstance(req.prompt, str):
        return [req.prompt]
    if all(isinstance(x, str) for x in req.prompt):
        return list(req.prompt)  # type: ignore[arg-type]
    return [runner.vocab.text(p) for p in prompts]


async def serve(request: Request, gens: Generations, answer: Callable[[], Awaitable[None]]) -> None:
    """Start the request's sequences and run `answer` (a stream, or the whole answer once
    collected); the sequences are cancelled when the client goes away or `answer` ends early."""
    gens.start()
    watcher = asyncio.ensure_future(request.watch_disconnect())
    disconnect = asyncio.ensure_future(request.disconnected.wait())
    disconnect.add_done_callback(lambda _: gens.cancel())
    try:
        await answer()
    finally:
        if gens.pending:
            gens.cancel()
        watcher.cancel()
        disconnect.cancel()


ENGINE_ERRORS = (PromptError, QueueFull, NotReady, GenerationFailed)


@contextmanager
def errors_renamed(rename: Callable[[ApiError], ApiError]) -> Iterator[None]:
    """Engine and API errors inside as HTTP errors whose field `rename` names as another API's
    request (the Responses and Messages APIs ask through the chat route's code)."""
    try:
        yield
    except ENGINE_ERRORS as e:
        raise rename(engine_error(e)) from None
    except ApiError as e:
        raise rename(e) from None


def engine_error(exc: Exception) -> ApiError:
    """The HTTP error for an engine exception."""
    if isinstance(exc, PromptError):
        return bad_request(str(exc), param=exc.param, code=exc.code)
    if isinstance(exc, QueueFull):
        return ApiError(
            429, f"model '{exc}' has too many requests queued; retry later",
            type="rate_limit_error", code="queue_full", headers=RETRY_AFTER,
        )
    if isinstance(exc, NotReady):
        return ApiError(503, f"model is not ready: {exc}", type="service_unavailable", code="model_not_ready")
    if isinstance(exc, GenerationFailed):
        return failure_error(Failed(exc.kind, str(exc)))
    raise exc


def failure_error(ev: Failed) -> ApiError:
    if ev.kind == "timeout":
        return ApiError(504, ev.message, type="timeout", code="deadline_exceeded")
    if ev.kind == "shutdown":
        return ApiError(503, ev.message, type="service_unavailable", code="shutting_down")
    if ev.kind == "cancelled":
        return ApiError(499, ev.message, code="cancelled")
    if ev.kind == "invalid_request":
        return bad_request(ev.message)
    return ApiError(500, ev.message, type="server_error", code="generation_failed")


def deadline(config: Config) -> float:
    return time.monotonic() + config.server.limits.request_timeout_s
