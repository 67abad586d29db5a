"""An Ollama API request in chat terms: /api/chat's messages and options, and /api/generate's
prompt and system, into a ChatRequest (or, with `raw`, prompt tokens of its own)."""

from __future__ import annotations

import json
import re
from typing import Any

import msgspec

from .errors import ApiError, bad_request, with_param_renamed
from .ollama_schemas import OllamaChatRequest, OllamaGenerateRequest, OllamaOptions
from .schemas import (
    ChatMessage,
    ChatRequest,
    FunctionCall,
    FunctionDef,
    JsonSchemaFormat,
    ResponseFormat,
    Tool,
    ToolCall,
)

ROLES = ("system", "user", "assistant", "tool")
# Ollama's sampling defaults where a request's options do not say (its documented ones)
DEFAULTS = {"temperature": 0.8, "top_k": 40, "top_p": 0.9}


def chat_request(req: OllamaChatRequest) -> ChatRequest:
    messages = []
    for i, m in enumerate(req.messages):
        if m.role not in ROLES:
            raise bad_request(f"role {m.role!r} is not one of {', '.join(ROLES)}", param=f"messages[{i}].role")
        if m.images:
            raise bad_request("images are not supported: the models here read text", param=f"messages[{i}].images")
        calls = [ToolCall(id=f"call_{i}_{k}", function=FunctionCall(c.function.name,
                                                                     json.dumps(c.function.arguments, ensure_ascii=False)))
                 for k, c in enumerate(m.tool_calls or [])]
        content = m.content or ""  # (null: as Go reads it)
        messages.append(ChatMessage(m.role, content if content or not calls else None, tool_calls=calls or None,
                                    name=m.tool_name if m.role == "tool" else None))
    tools = [Tool("function", FunctionDef(t.function.name, t.function.description, t.function.parameters))
             for t in req.tools or []]
    for i, t in enumerate(req.tools or []):
        if t.type != "function":
            raise bad_request(f"tool type {t.type!r} is not supported (function only)", param=f"tools[{i}].type")
    chat = _chat(req, messages, tools or None)
    final = messages[-1] if messages else None
    if final is not None and final.role == "assistant" and not final.tool_calls:
        # as Ollama's templates leave a last assistant message open: the model goes on from it
        chat = msgspec.structs.replace(chat, continue_final_message=True)
    return chat


def generate_request(req: OllamaGenerateRequest) -> ChatRequest:
    """A templated /api/generate request as a chat: the system message, then the prompt."""
    _refuse_generate_fields(req)
    messages = ([ChatMessage("system", req.system)] if req.system else []) + [ChatMessage("user", req.prompt)]
    return _chat(req, messages, None)


def _refuse_generate_fields(req: OllamaGenerateRequest) -> None:
    for field, why in (("template", "a model's template is set in the config (models[].chat_template)"),
                       ("images", "the models here read text"),
                       ("context", "send the conversation to /api/chat instead")):
        if getattr(req, field):
            raise bad_request(f"{field} is not supported: {why}", param=field)


def raw_request(req: OllamaGenerateRequest) -> ChatRequest:
    """A raw /api/generate request's (or one with a `suffix`: fill-in-the-middle) sampling, format
    and limits as a chat request would carry them (its prompt is not rendered by the template)."""
    _refuse_generate_fields(req)
    if req.system:
        why = "the gap's prompt is built from prompt and suffix" if req.suffix else "write it into the prompt"
        raise bad_request(f"system does not apply to a raw prompt: {why}", param="system")
    return _chat(req, [ChatMessage("user", req.prompt)], None)


def _chat(req: OllamaChatRequest | OllamaGenerateRequest, messages: list[ChatMessage],
          tools: list[Tool] | None) -> ChatRequest:
    opts = req.options or OllamaOptions()
    sampling: dict[str, Any] = {k: v for k, v in DEFAULTS.items() if getattr(opts, k) is None}
    for key in ("temperature", "top_p", "top_k", "min_p", "seed", "stop", "repeat_penalty", "presence_penalty",
                "frequency_penalty", "repeat_last_n", "typical_p", "mirostat", "mirostat_tau", "mirostat_eta"):
        if getattr(opts, key) is not None:
            sampling[key] = getattr(opts, key)
    if isinstance(sampling.get("stop"), (str, list)):  # an empty stop string is skipped, as Ollama does
        stops = [s for s in ([sampling["stop"]] if isinstance(sampling["stop"], str) else sampling["stop"]) if s]
        sampling["stop"] = stops or None
    if opts.num_predict == 0:
        raise bad_request("num_predict 0 asks for no answer", param="options.num_predict")
    kwargs = effort = None
    if req.think in ("low", "medium", "high"):
        effort = req.think  # thinking on, bounded by the level's budget (models[].reasoning_effort_budgets)
    elif req.think is not None:
        kwargs = {"enable_thinking": req.think not in (False, "false", "none")}
    seeded = sampling.get("seed") is not None and sampling.get("temperature") != 0
    return ChatRequest(
        model=req.model, messages=messages, speculative=not seeded if req.speculative is None else req.speculative,
        max_completion_tokens=opts.num_predict if opts.num_predict and opts.num_predict > 0 else None,
        response_format=_format(req.format), grammar=req.grammar, logit_bias=req.logit_bias, tools=tools, chat_template_kwargs=kwargs,
        reasoning_effort=effort,
        logprobs=req.logprobs or None, top_logprobs=req.top_logprobs if req.logprobs else None, **sampling,
    )


def _format(fmt: str | dict[str, Any] | None) -> ResponseFormat | None:
    if fmt is None or fmt == "":
        return None
    if fmt == "json":
        return ResponseFormat("json_object")
    if isinstance(fmt, dict):
        return ResponseFormat("json_schema", JsonSchemaFormat("format", fmt))
    raise bad_request('format must be "json" or a JSON Schema object', param="format")


_RENAMES = (
    (re.compile(r"^response_format\.json_schema\.schema"), "format"),
    (re.compile(r"^response_format"), "format"),
    (re.compile(r"^max_(completion_)?tokens$"), "options.num_predict"),
    (re.compile(r"^continue_final_message$"), "messages"),  # set by a last assistant message
)


def renamed(err: ApiError) -> ApiError:
    """The chat route's error with its field named as the Ollama request names it."""
    return with_param_renamed(err, _RENAMES)


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: Any) -> float | None:
    """Ollama's keep_alive in seconds: a number of seconds or a Go duration ("5m", "1h30m", "-1s");
    negative: never unloaded for idleness (inf). None when not given; a 400 naming it when not
    readable."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    elif isinstance(value, str) and (text := value.strip()):
        sign, body = (-1.0, text[1:]) if text.startswith("-") else (1.0, text.lstrip("+"))
        try:
            seconds = sign * float(body)  # a plain number: seconds
        except ValueError:
            parts = _DURATION_PART.findall(body)
            if not parts or "".join(n + u for n, u in parts) != body:
                raise bad_request(f"keep_alive {value!r} is not a duration (seconds, or Go's form: 30s, 5m, 1h30m)",
                                  param="keep_alive") from None
            seconds = sign * sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
    else:
        raise bad_request("keep_alive must be a number of seconds or a duration string", param="keep_alive")
    if seconds != seconds:  # NaN
        raise bad_request("keep_alive must be a number", param="keep_alive")
    return float("inf") if seconds < 0 else seconds
