"""The deprecated functions/function_call as tools, and the answer back in their shape."""

from __future__ import annotations

import msgspec
import pytest

from appliance.api.errors import ApiError
from appliance.api.legacy_functions import as_tools, legacy_error, legacy_message
from appliance.api.schemas import AssistantMessage, ChatRequest, FunctionCall, ToolCall

decode = msgspec.json.Decoder(ChatRequest).decode


def request(**kw) -> ChatRequest:
    return decode(msgspec.json.encode({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}))


def test_functions_become_one_call_tools_and_a_named_choice():
    req, legacy = as_tools(request(functions=[{"name": "f", "parameters": {"type": "object"}}],
                                   function_call={"name": "f"}))
    assert legacy and req.functions is None and req.function_call is None
    assert [t.function.name for t in req.tools] == ["f"] and req.tools[0].type == "function"
    assert req.tool_choice.type == "function" and req.tool_choice.function.name == "f"
    assert req.parallel_tool_calls is False
    for choice in ("none", "auto", None):
        assert as_tools(request(functions=[{"name": "f"}], **({"function_call": choice} if choice else {})))[0] \
            .tool_choice == choice


def test_a_legacy_history_becomes_tool_calls_and_tool_messages_even_with_tools():
    messages = [{"role": "user", "content": "2+3?"},
                {"role": "assistant", "content": None, "function_call": {"name": "add", "arguments": "{}"}},
                {"role": "function", "name": "add", "content": "5"}]
    req, legacy = as_tools(request(messages=messages, tools=[{"type": "function", "function": {"name": "add"}}]))
    assert not legacy  # a tools request: its answer goes back as tool_calls
    assert req.messages[1].tool_calls == [ToolCall(function=FunctionCall("add", "{}"))]
    assert req.messages[1].function_call is None
    assert (req.messages[2].role, req.messages[2].name, req.messages[2].tool_call_id) == ("tool", "add", None)


def test_a_plain_request_is_left_as_it_is():
    req = request(tools=[{"type": "function", "function": {"name": "f"}}])
    assert as_tools(req) == (req, False)


@pytest.mark.parametrize("kw,param", [
    ({"functions": [{"name": "f"}], "tools": [{"type": "function", "function": {"name": "f"}}]}, "functions"),
    ({"functions": [{"name": "f"}], "tool_choice": "auto"}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"messages": [{"role": "function", "content": "5"}]}, "messages[0].name"),
    ({"messages": [{"role": "assistant", "function_call": {"name": "f"},
                    "tool_calls": [{"function": {"name": "f"}}]}]}, "messages[0].function_call"),
])
def test_mixed_or_incomplete_forms_are_refused_by_field(kw, param):
    with pytest.raises(ApiError) as err:
        as_tools(request(**kw))
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize("sent,named", [
    ("tools[3].function.parameters.properties.x", "functions[3].parameters.properties.x"),
    ("tools[0].function.name", "functions[0].name"),
    ("tool_choice.function.name", "function_call.name"),
    ("tool_choice", "function_call"),
    ("messages", "messages"),
])
def test_errors_name_the_legacy_fields(sent, named):
    assert legacy_error(ApiError(400, "x", param=sent)).param == named


def test_the_answer_goes_back_as_function_call():
    call = FunctionCall("f", '{"a": 1}')
    message, reason = legacy_message(AssistantMessage("assistant", None, [ToolCall(id="call_1", function=call)]),
                                     "tool_calls")
    assert (message.function_call, message.tool_calls, reason) == (call, None, "function_call")
    text = AssistantMessage("assistant", "hello")
    assert legacy_message(text, "stop") == (text, "stop")


def test_function_call_does_not_take_a_positional_field():
    """AssistantMessage is built positionally (role, content, tool_calls, reasoning): the legacy
    field comes last, so a thinking answer keeps its reasoning_content."""
    message = msgspec.json.decode(msgspec.json.encode(AssistantMessage("assistant", "4", None, "2 + 2")))
    assert message == {"role": "assistant", "content": "4", "reasoning_content": "2 + 2"}
