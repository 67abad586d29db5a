"""An Anthropic Messages API request in chat terms: its system prompt and content blocks read into
chat messages, the request into a ChatRequest, and the chat route's error fields renamed."""

from __future__ import annotations

import json
import re
from typing import Any

from .errors import ApiError, bad_request, with_param_renamed
from .anthropic_schemas import MessagesRequest
from .schemas import (
    ChatMessage,
    ChatRequest,
    FunctionCall,
    FunctionDef,
    JsonSchemaFormat,
    ResponseFormat,
    Tool,
    ToolCall,
    ToolChoice,
    ToolChoiceFunction,
    extra_samplers,
)

_SKIPPED = ("thinking", "redacted_thinking")  # an earlier answer's thinking: chat templates leave it out


def system_text(system: str | list[Any] | None) -> str | None:
    """The system prompt: a string, or text blocks (joined by blank lines)."""
    if system is None or isinstance(system, str):
        return system or None
    texts = []
    for j, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise bad_request("system blocks must be text blocks", param=f"system[{j}]")
        texts.append(block["text"])
    return "\n\n".join(texts) or None


def messages(req: MessagesRequest) -> list[ChatMessage]:
    """Chat messages for the request's system prompt and messages: an assistant's tool_use blocks
    are its tool calls, a user's tool_result blocks are tool messages (before the user's text)."""
    out = [ChatMessage("system", system)] if (system := system_text(req.system)) else []
    called: set[str] = set()  # the tool_use ids of the turns so far
    for i, message in enumerate(req.messages):
        where = f"messages[{i}].content"
        last_assistant = i == len(req.messages) - 1 and message.role == "assistant"
        if not message.content and not last_assistant:  # (Anthropic's: only a prefill may be empty)
            raise bad_request("a message's content must not be empty (only a final assistant message may be)",
                              param=where)
        if isinstance(message.content, str):
            out.append(ChatMessage(message.role, message.content))
            continue
        texts: list[str] = []
        calls: list[ToolCall] = []
        for j, block in enumerate(message.content):
            kind = block.get("type") if isinstance(block, dict) else None
            at = f"{where}[{j}]"
            if kind == "text":
                if not isinstance(block.get("text"), str):
                    raise bad_request("a text block needs its text as a string", param=f"{at}.text")
                texts.append(block["text"])
            elif kind == "tool_use" and message.role == "assistant":
                arguments = block.get("input", {})
                if not isinstance(arguments, dict):
                    raise bad_request("a tool_use block's input must be an object", param=f"{at}.input")
                calls.append(ToolCall(id=_string(block, "id", at), function=FunctionCall(
                    _string(block, "name", at), json.dumps(arguments, ensure_ascii=False))))
                called.add(calls[-1].id)
            elif kind == "tool_result" and message.role == "user":
                tool_use_id = _string(block, "tool_use_id", at)
                if tool_use_id not in called:  # (a result attached to no call: the model saw another conversation)
                    raise bad_request(f"tool_result {tool_use_id!r} answers no tool_use of an earlier assistant turn",
                                      param=f"{at}.tool_use_id")
                out.append(ChatMessage("tool", _result_text(block, at), tool_call_id=tool_use_id))
            elif kind in _SKIPPED and message.role == "assistant":
                continue
            else:
                raise bad_request(f"content block type {kind!r} is not supported in a {message.role} message here "
                                  "(text, tool_use from the assistant, tool_result from the user)", param=f"{at}.type")
        if message.role == "assistant":
            out.append(ChatMessage("assistant", "".join(texts) or (None if calls else ""), tool_calls=calls or None))
        elif texts or not message.content:
            out.append(ChatMessage("user", "".join(texts)))
    return out


def _string(block: dict[str, Any], key: str, where: str) -> str:
    value = block.get(key)
    if not isinstance(value, str) or not value:
        raise bad_request(f"{where}.{key} must be a non-empty string", param=f"{where}.{key}")
    return value


def _result_text(block: dict[str, Any], where: str) -> str:
    content = block.get("content", "")
    if isinstance(content, list):
        texts = []
        for k, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad_request("tool_result content must be text blocks", param=f"{where}.content[{k}]")
            texts.append(part["text"])
        content = "".join(texts)
    elif not isinstance(content, str):
        raise bad_request("tool_result content must be a string or text blocks", param=f"{where}.content")
    return f"Error: {content}" if block.get("is_error") else content


def chat_request(req: MessagesRequest) -> ChatRequest:
    """The chat request that asks the model what `req` asks. `thinking` sets the template's
    `enable_thinking` (Qwen3's variable), under the request's own chat_template_kwargs, and its
    `budget_tokens` the think block's budget."""
    kwargs = req.chat_template_kwargs
    budget = None
    if req.thinking is not None:
        if req.thinking.type not in ("enabled", "disabled", "adaptive"):
            raise bad_request("thinking.type must be enabled, disabled or adaptive", param="thinking.type")
        kwargs = {"enable_thinking": req.thinking.type != "disabled", **(kwargs or {})}
        budget = req.thinking.budget_tokens if req.thinking.type == "enabled" else None
        if req.thinking.type == "enabled" and budget is None:
            raise bad_request("thinking.budget_tokens is required with thinking enabled", param="thinking.budget_tokens")
        if budget is not None and (budget < 0 or req.max_tokens is not None and budget >= req.max_tokens):
            raise bad_request(f"thinking.budget_tokens must be at least 0 and less than max_tokens ({req.max_tokens})",
                              param="thinking.budget_tokens")
    stops = [*(req.stop_sequences or []), *([req.stop] if isinstance(req.stop, str) else req.stop or [])]
    choice = req.tool_choice
    chat = messages(req)
    final = chat[-1] if chat else None
    return ChatRequest(
        model=req.model, messages=chat, max_completion_tokens=req.max_tokens,
        temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        repeat_penalty=req.repeat_penalty, seed=req.seed, stop=stops or None, logit_bias=req.logit_bias,
        grammar=req.grammar, response_format=_response_format(req), tools=_tools(req), tool_choice=_tool_choice(req),
        parallel_tool_calls=not (choice is not None and choice.disable_parallel_tool_use),
        reasoning_format=req.reasoning_format, chat_template_kwargs=kwargs, thinking_budget_tokens=budget,
        speculative=req.speculative,
        # a last assistant message is the answer begun (a prefill): the model goes on from it
        continue_final_message=final is not None and final.role == "assistant" and not final.tool_calls,
        **extra_samplers(req),
    )


def _tools(req: MessagesRequest) -> list[Tool] | None:
    if not req.tools:
        return None
    out = []
    for i, tool in enumerate(req.tools):
        if tool.type not in (None, "custom"):
            raise bad_request(f"tool type {tool.type!r} is not available on this server (client tools only)",
                              param=f"tools[{i}].type")
        if not isinstance(tool.input_schema, dict):
            raise bad_request("a tool needs its input_schema (a JSON Schema object)", param=f"tools[{i}].input_schema")
        out.append(Tool("function", FunctionDef(tool.name, tool.description, tool.input_schema)))
    return out


def _tool_choice(req: MessagesRequest) -> str | ToolChoice | None:
    choice = req.tool_choice
    if choice is None:
        return None
    if choice.type in ("auto", "none"):
        return choice.type
    if choice.type == "any":
        return "required"
    if choice.type == "tool" and choice.name:
        return ToolChoice("function", ToolChoiceFunction(choice.name))
    raise bad_request("tool_choice must be {type: auto}, {type: any}, {type: none} or {type: tool, name}",
                      param="tool_choice")


def _response_format(req: MessagesRequest) -> ResponseFormat | None:
    """Structured output (`output_config.format`, or the beta's `output_format`) as chat's
    response_format: the answer's text is JSON of the schema."""
    if req.output_config is not None and req.output_config.format is not None:
        fmt, where = req.output_config.format, "output_config.format"
    elif req.output_format is not None:
        fmt, where = req.output_format, "output_format"
    else:
        return None
    if fmt.type != "json_schema":
        raise bad_request(f"{where}.type must be json_schema", param=f"{where}.type")
    if fmt.schema is None:
        raise bad_request(f"{where} needs a schema", param=f"{where}.schema")
    return ResponseFormat("json_schema", JsonSchemaFormat("output", fmt.schema))


_RENAMES = (
    (re.compile(r"^(tools\[\d+\])\.function\.parameters"), r"\1.input_schema"),
    (re.compile(r"^response_format\.json_schema\.schema"), "output_config.format.schema"),
    (re.compile(r"^response_format"), "output_config.format"),
    (re.compile(r"^(tools\[\d+\])\.function"), r"\1"),
    (re.compile(r"^tool_choice\.function\.name$"), "tool_choice.name"),
    (re.compile(r"^max_(completion_)?tokens$"), "max_tokens"),
    (re.compile(r"^continue_final_message$"), "messages"),  # set by a last assistant message (a prefill)
)


def renamed(err: ApiError) -> ApiError:
    """The chat route's error with its field named as the Messages request names it."""
    return with_param_renamed(err, _RENAMES)
