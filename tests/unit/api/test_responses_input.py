"""Responses API input items read into chat messages, and the chat route's error fields renamed."""

from __future__ import annotations

import msgspec
import pytest

from appliance.api.errors import ApiError
from appliance.api.generation import thinking_kwargs
from appliance.api.responses_input import chat_request, items, messages, renamed
from appliance.api.responses_schemas import ResponsesRequest


def request(**kw) -> ResponsesRequest:
    return msgspec.convert({"model": "m", "input": "Hi", **kw}, ResponsesRequest)


def test_a_string_is_one_user_message():
    got = items("Hello")
    assert [(i["type"], i["role"], i["content"]) for i in got] == [("message", "user",
                                                                    [{"type": "input_text", "text": "Hello"}])]
    assert got[0]["id"].startswith("msg_")


def test_function_calls_join_the_assistant_message_before_them():
    got = messages(items([
        {"role": "user", "content": "Weather?"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
        {"type": "function_call", "call_id": "c1", "name": "w", "arguments": '{"city": "Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "w", "arguments": '{"city": "Rome"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "cold"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "warm"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "c3", "name": "w"},
    ]))
    assert [m.role for m in got] == ["user", "assistant", "tool", "tool", "assistant"]
    assert got[1].content == "Let me look." and [c.id for c in got[1].tool_calls] == ["c1", "c2"]
    assert got[1].tool_calls[1].function.arguments == '{"city": "Rome"}'
    assert (got[2].tool_call_id, got[2].content, got[3].content) == ("c1", "cold", "warm")
    assert got[4].content is None and got[4].tool_calls[0].function.arguments == "{}"


@pytest.mark.parametrize("value,param", [
    ([3], "input[0]"),
    ([{"type": "message", "role": "user", "content": 5}], "input[0].content"),
    ([{"role": "assistant", "content": [{"type": "input_image"}]}], "input[0].content[0].type"),
    ([{"role": "user", "content": [{"type": "output_text", "text": "x"}]}], "input[0].content[0].type"),
    ([{"role": "user", "content": [{"type": "input_text"}]}], "input[0].content[0].text"),
    ([{"role": "user", "content": "ok"}, {"type": "function_call", "call_id": "c", "name": ""}], "input[1].name"),
    ([{"type": "computer_call"}], "input[0].type"),
])
def test_an_item_this_server_cannot_take_is_named(value, param):
    with pytest.raises(ApiError) as e:
        items(value)
    assert e.value.status == 400 and e.value.param == param


def test_the_chat_request_carries_the_sampling_tools_and_format():
    req = request(instructions="Be brief.", max_output_tokens=7, temperature=0.3, top_k=5, seed=9,
                  tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                  tool_choice={"type": "function", "name": "f"}, parallel_tool_calls=False,
                  text={"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
                  include=["message.output_text.logprobs"], top_logprobs=3)
    chat = chat_request(req, messages(items(req.input)))
    assert [(m.role, m.content) for m in chat.messages] == [("system", "Be brief."), ("user", "Hi")]
    assert (chat.max_completion_tokens, chat.temperature, chat.top_k, chat.seed) == (7, 0.3, 5, 9)
    assert chat.tools[0].function.name == "f" and chat.tool_choice.function.name == "f"
    assert chat.parallel_tool_calls is False
    assert chat.response_format.type == "json_schema" and chat.response_format.json_schema.schema == {"type": "object"}
    assert chat.logprobs and chat.top_logprobs == 3
    assert chat_request(request(max_tool_calls=1), messages(items("Hi"))).parallel_tool_calls is False
    with pytest.raises(ApiError) as e:
        chat_request(request(max_tool_calls=2), messages(items("Hi")))
    assert e.value.param == "max_tool_calls"
    plain = chat_request(request(top_logprobs=3), messages(items("Hi")))
    assert plain.logprobs is None and plain.top_logprobs is None and plain.response_format is None


@pytest.mark.parametrize("chat_param,param", [
    ("response_format.json_schema.schema.properties.a.multipleOf", "text.format.schema.properties.a.multipleOf"),
    ("response_format.schema", "text.format.schema"),
    ("response_format.type", "text.format.type"),
    ("tools[2].function.parameters.minimum", "tools[2].parameters.minimum"),
    ("tools[0].function.name", "tools[0].name"),
    ("tool_choice.function.name", "tool_choice.name"),
    ("messages", "input"),
    ("messages[3].content[0].type", "input"),
    ("max_tokens", "max_output_tokens"),
    ("max_completion_tokens", "max_output_tokens"),
    ("grammar", "grammar"),
    ("model", "model"),
])
def test_chat_fields_are_named_as_the_responses_request_names_them(chat_param, param):
    assert renamed(ApiError(400, "x", param=chat_param)).param == param


def test_reasoning_effort_turns_the_templates_thinking_on_or_off():
    def kwargs(**kw):
        return thinking_kwargs(chat_request(request(**kw), messages(items("Hi"))))

    assert kwargs() is None
    assert chat_request(request(reasoning={"effort": "low"}), messages(items("Hi"))).reasoning_effort == "low"
    assert kwargs(reasoning={"effort": "none"}) == {"enable_thinking": False}
    assert kwargs(reasoning={"effort": "minimal"}) == {"enable_thinking": False}
    assert kwargs(reasoning={"effort": "high"}) == {"enable_thinking": True, "reasoning_effort": "high"}  # gpt-oss's
    assert kwargs(reasoning={"effort": "none"}, chat_template_kwargs={"enable_thinking": True, "x": 1}) == {
        "enable_thinking": True, "x": 1}
