"""A Responses API request in chat terms: its input items read into chat messages, the request
into a ChatRequest, and the chat route's error fields renamed to the Responses request's."""

from __future__ import annotations

import re
import uuid
from typing import Any

from .errors import ApiError, bad_request, with_param_renamed
from .responses_schemas import ResponsesRequest
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

ROLES = ("user", "system", "developer", "assistant")
_TEXT_PARTS = {"user": ("input_text",), "system": ("input_text",), "developer": ("input_text",),
               "assistant": ("output_text", "refusal", "input_text")}


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def items(value: str | list[Any], field: str = "input") -> list[dict[str, Any]]:
    """The request's input as items in the form GET /v1/responses/{id}/input_items lists them
    (each with an id); a string is one user message. An item this server cannot take is a 400
    naming it (`input[2].content[0].type`; `field`: the list's name)."""
    if isinstance(value, str):
        return [_message("user", value)]
    return [_item(raw, f"{field}[{i}]") for i, raw in enumerate(value)]


def _message(role: str, text: str, item_id: str | None = None) -> dict[str, Any]:
    part = "output_text" if role == "assistant" else "input_text"
    return {"type": "message", "id": item_id or new_id("msg"), "role": role, "status": "completed",
            "content": [{"type": part, "text": text}]}


def _item(raw: Any, where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise bad_request(f"{where} must be an object (a message, function_call or function_call_output)",
                          param=where)
    kind = raw.get("type", "message")
    if kind == "message":
        role = raw.get("role")
        if role not in ROLES:
            raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}", param=f"{where}.role")
        return _message(role, _text(raw.get("content"), role, f"{where}.content"), _string(raw, "id", where, False))
    if kind == "function_call":
        return {"type": "function_call", "id": _string(raw, "id", where, False) or new_id("fc"),
                "call_id": _string(raw, "call_id", where), "name": _string(raw, "name", where),
                "arguments": _string(raw, "arguments", where, False) or "{}", "status": "completed"}
    if kind == "function_call_output":
        output = raw.get("output")
        text = output if isinstance(output, str) else _text(output, "user", f"{where}.output")
        return {"type": "function_call_output", "id": _string(raw, "id", where, False) or new_id("fco"),
                "call_id": _string(raw, "call_id", where), "output": text, "status": "completed"}
    if kind == "reasoning":
        # an earlier answer's reasoning: kept in the listing, not in the prompt (chat templates
        # leave earlier turns' thinking out)
        return {"type": "reasoning", "id": _string(raw, "id", where, False) or new_id("rs"),
                "summary": raw.get("summary") or [], "content": raw.get("content") or []}
    raise bad_request(f"{where}.type {kind!r} is not supported: this server takes message, function_call, "
                      "function_call_output and reasoning items", param=f"{where}.type")


def _string(raw: dict[str, Any], key: str, where: str, required: bool = True) -> str | None:
    value = raw.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or (required and not value):
        raise bad_request(f"{where}.{key} must be a non-empty string", param=f"{where}.{key}")
    return value


def _text(content: Any, role: str, where: str) -> str:
    """A message's content as text: a string, or text parts (input_text, output_text)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"{where} must be a string or a list of content parts", param=where)
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS[role]:
            raise bad_request(f"content part type {kind!r} is not supported here (text only: "
                              f"{', '.join(_TEXT_PARTS[role])})", param=f"{where}[{j}].type")
        text = part.get("refusal" if kind == "refusal" else "text")
        if not isinstance(text, str):
            raise bad_request(f"{where}[{j}].text must be a string", param=f"{where}[{j}].text")
        texts.append(text)
    return "".join(texts)


def messages(input_items: list[dict[str, Any]]) -> list[ChatMessage]:
    """Chat messages for input items: function calls join the assistant message before them
    (or make one), each function output is a tool message."""
    return messages_and_sources(input_items)[0]


def messages_and_sources(input_items: list[dict[str, Any]]) -> tuple[list[ChatMessage], list[int]]:
    """`messages`, and for each message the index of the item it starts with."""
    out: list[ChatMessage] = []
    sources: list[int] = []
    for i, item in enumerate(input_items):
        kind = item["type"]
        if kind == "message":
            out.append(ChatMessage(item["role"], "".join(part.get("text", "") for part in item["content"])))
            sources.append(i)
        elif kind == "function_call":
            call = ToolCall(id=item["call_id"], function=FunctionCall(item["name"], item["arguments"]))
            last = out[-1] if out else None
            if last is not None and last.role == "assistant":
                out[-1] = ChatMessage("assistant", last.content, tool_calls=[*(last.tool_calls or []), call])
            else:
                out.append(ChatMessage("assistant", None, tool_calls=[call]))
                sources.append(i)
        elif kind == "function_call_output":
            out.append(ChatMessage("tool", item["output"], tool_call_id=item["call_id"]))
            sources.append(i)
    return out, sources


def chat_request(req: ResponsesRequest, conversation: list[ChatMessage]) -> ChatRequest:
    """The chat request that asks the model what `req` asks, over `conversation` (the earlier
    responses' turns and this input, after the instructions)."""
    for field, allowed in (("prompt", (None,)), ("truncation", (None, "disabled", "auto"))):
        if getattr(req, field) not in allowed:
            raise bad_request(f"{field} is not supported by this server", param=field)
    if req.background and not req.store:
        raise bad_request("a background response is stored (it is read with GET /v1/responses/{id}): "
                          "leave store true", param="background")
    for value in req.include or []:
        if value != "message.output_text.logprobs":
            raise bad_request(f"include value {value!r} is not supported (message.output_text.logprobs only)",
                              param="include")
    if req.max_tool_calls not in (None, 1):
        raise bad_request("max_tool_calls can only be 1 here (one call, as parallel_tool_calls: false)",
                          param="max_tool_calls")
    msgs = ([ChatMessage("system", req.instructions)] if req.instructions else []) + conversation
    if not msgs:
        raise bad_request("input must not be empty", param="input")
    logprobs = "message.output_text.logprobs" in (req.include or [])
    return ChatRequest(
        model=req.model, messages=msgs, max_completion_tokens=req.max_output_tokens,
        temperature=req.temperature, top_p=req.top_p, top_k=req.top_k, min_p=req.min_p,
        presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
        repeat_penalty=req.repeat_penalty, seed=req.seed, stop=req.stop, logit_bias=req.logit_bias, grammar=req.grammar,
        response_format=_response_format(req), tools=_tools(req), tool_choice=_tool_choice(req.tool_choice),
        parallel_tool_calls=req.parallel_tool_calls and req.max_tool_calls is None, reasoning_format=req.reasoning_format,
        chat_template_kwargs=req.chat_template_kwargs, reasoning_effort=_effort(req),
        thinking_budget_tokens=req.thinking_budget_tokens, speculative=req.speculative,
        logprobs=logprobs or None, top_logprobs=req.top_logprobs if logprobs else None,
        **extra_samplers(req),
    )


def _effort(req: ResponsesRequest) -> str | None:
    """`reasoning.effort`, read as the chat route reads `reasoning_effort` (generation.py)."""
    return req.reasoning.effort if req.reasoning is not None else None


def _response_format(req: ResponsesRequest) -> ResponseFormat | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return ResponseFormat("json_object")
    if fmt.type == "json_schema":
        if fmt.schema is None:
            raise bad_request("text.format type json_schema needs schema", param="text.format.schema")
        return ResponseFormat("json_schema", JsonSchemaFormat(fmt.name, fmt.schema, fmt.strict, fmt.description))
    raise bad_request(f"text.format.type {fmt.type!r} is not one of text, json_object, json_schema",
                      param="text.format.type")


def _tools(req: ResponsesRequest) -> list[Tool] | None:
    if not req.tools:
        return None
    out = []
    for i, tool in enumerate(req.tools):
        if tool.type != "function":
            raise bad_request(f"tool type {tool.type!r} is not available on this server (function tools only)",
                              param=f"tools[{i}].type")
        if not tool.name:
            raise bad_request("a function tool needs a name", param=f"tools[{i}].name")
        out.append(Tool("function", FunctionDef(tool.name, tool.description, tool.parameters, tool.strict)))
    return out


def _tool_choice(choice: Any) -> str | ToolChoice | None:
    if choice is None or isinstance(choice, str):
        return choice
    if choice.type != "function" or not choice.name:
        raise bad_request("tool_choice must be none, auto, required or {type: function, name}", param="tool_choice")
    return ToolChoice("function", ToolChoiceFunction(choice.name))


# a chat request's field, as the Responses request names it
_RENAMES = (
    (re.compile(r"^response_format\.json_schema\.schema"), "text.format.schema"),
    (re.compile(r"^response_format\.schema"), "text.format.schema"),
    (re.compile(r"^response_format"), "text.format"),
    (re.compile(r"^(tools\[\d+\])\.function"), r"\1"),
    (re.compile(r"^tool_choice\.function\.name$"), "tool_choice.name"),
    (re.compile(r"^messages(\[\d+\].*)?$"), "input"),
    (re.compile(r"^max_(completion_)?tokens$"), "max_output_tokens"),
)


def renamed(err: ApiError) -> ApiError:
    """The chat route's error with its field named as the Responses request names it."""
    return with_param_renamed(err, _RENAMES)


def check_new_ids(items: list[dict[str, Any]], present: list[dict[str, Any]], field: str) -> None:
    """A 400 naming `field[i].id` for the first item whose id the conversation (`present`) or an
    item before it has: a conversation's item ids are unique (GET, DELETE and pages name them)."""
    known = {item["id"] for item in present}
    for i, item in enumerate(items):
        if item["id"] in known:
            raise ApiError(400, f"the conversation has an item {item['id']!r} already", param=f"{field}[{i}].id")
        known.add(item["id"])
