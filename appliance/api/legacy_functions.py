"""OpenAI's deprecated `functions` and `function_call`, served as tools: the request becomes one
with `tools` and `tool_choice` (one call per answer, as the legacy API gives), its history's
`function_call`s and `function` messages become tool calls and tool messages, and the answer's
call goes back as the message's `function_call` with `finish_reason: function_call`."""

from __future__ import annotations

import re

import msgspec

from .errors import ApiError, bad_request
from .schemas import AssistantMessage, ChatMessage, ChatRequest, Tool, ToolCall, ToolChoice, ToolChoiceFunction

LEGACY_REASON = "function_call"


def as_tools(req: ChatRequest) -> tuple[ChatRequest, bool]:
    """The request with its legacy fields as tools, and whether it had any (its answer then goes
    back in the legacy shape). A request that mixes both forms is a 400."""
    legacy_history = any(m.role == "function" or m.function_call is not None for m in req.messages)
    if req.functions is None and req.function_call is None and not legacy_history:
        return req, False
    if req.functions is not None and (req.tools is not None or req.tool_choice is not None):
        raise bad_request("functions is the deprecated form of tools: send one or the other", param="functions")
    if req.function_call is not None and req.functions is None:
        raise bad_request("function_call needs functions", param="function_call")
    messages = [_message(m, i) for i, m in enumerate(req.messages)]
    if req.functions is None:  # a tools request (or none) with a legacy history
        return msgspec.structs.replace(req, messages=messages), False
    tools = [Tool("function", f) for f in req.functions]
    return msgspec.structs.replace(req, messages=messages, tools=tools, tool_choice=_choice(req.function_call),
                                   parallel_tool_calls=False, functions=None, function_call=None), True


def _choice(function_call: str | ToolChoiceFunction | None) -> str | ToolChoice | None:
    """tool_choice for a function_call (the schema lets only none, auto or {name} through)."""
    return ToolChoice("function", function_call) if isinstance(function_call, ToolChoiceFunction) else function_call


def _message(msg: ChatMessage, i: int) -> ChatMessage:
    if msg.role == "function":
        if not msg.name:
            raise bad_request("a function message needs the name of the function it answers",
                              param=f"messages[{i}].name")
        return msgspec.structs.replace(msg, role="tool")
    if msg.function_call is None:
        return msg
    if msg.role != "assistant" or msg.tool_calls:
        raise bad_request("function_call belongs to an assistant message without tool_calls",
                          param=f"messages[{i}].function_call")
    return msgspec.structs.replace(msg, function_call=None, tool_calls=[ToolCall(function=msg.function_call)])


_TOOL_PARAMS = ((re.compile(r"^tools(\[\d+\])\.function\."), r"functions\1."),
                (re.compile(r"^tool_choice\.function\.name$"), "function_call.name"),
                (re.compile(r"^tool_choice$"), "function_call"))


def legacy_error(err: ApiError) -> ApiError:
    """`err` raised for the tools a legacy request became, naming the fields the client sent."""
    for pattern, replacement in _TOOL_PARAMS:
        if err.param and pattern.search(err.param):
            err.param = pattern.sub(replacement, err.param)
            break
    return err


def legacy_message(message: AssistantMessage, finish_reason: str) -> tuple[AssistantMessage, str]:
    """An answer's message in the legacy shape: its call (there is at most one) as `function_call`."""
    if not message.tool_calls:
        return message, finish_reason
    call = message.tool_calls[0].function
    return msgspec.structs.replace(message, tool_calls=None, function_call=call), legacy_reason(finish_reason)


def legacy_reason(finish_reason: str) -> str:
    """finish_reason in the legacy shape: function_call for tool_calls."""
    return LEGACY_REASON if finish_reason == "tool_calls" else finish_reason
