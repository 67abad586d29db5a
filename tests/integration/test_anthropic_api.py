"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) through the real server
and the official Anthropic SDK: a message is the chat completion of the same conversation (same
prompt tokens, same greedy answer), streamed and whole alike; tool_use and tool_result blocks,
think blocks as thinking blocks, stop sequences, and Anthropic's error envelope."""

from __future__ import annotations

import json

import anthropic
import httpx
import pytest

from conftest import SMOLLM2, model_entry
from reasoning_templates import QWEN3_STYLE, THINK

KEY = "anthropic-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
GREEDY = {"temperature": 0}
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory({
        "server": {"api_keys": [KEY]},
        "models": [model_entry("smol", SMOLLM2, n_parallel=2),
                   model_entry("qwen3-style", SMOLLM2, n_parallel=1, chat_template=QWEN3_STYLE)],
    }, "anthropic")


@pytest.fixture(scope="module")
def client(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.base, api_key=KEY, max_retries=0, timeout=300)


def chat(server, messages: list[dict], model: str = "smol", **kw) -> dict:
    r = httpx.post(server.base + "/v1/chat/completions", headers=AUTH, timeout=300, json={
        "model": model, "messages": messages, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def tokens(server, messages: list[dict], **kw) -> int:
    r = httpx.post(server.base + "/tokenize", headers=AUTH, json={"model": "smol", "messages": messages, **kw})
    assert r.status_code == 200, r.text
    return r.json()["count"]


def test_a_message_is_the_chat_answer_whole_and_streamed(server, client):
    expected = chat(server, [{"role": "system", "content": "Answer briefly."},
                             {"role": "user", "content": "Name a fruit."}], max_tokens=24)
    whole = client.messages.create(model="smol", max_tokens=24, system="Answer briefly.",
                                   messages=[{"role": "user", "content": "Name a fruit."}], extra_body=GREEDY)
    assert [b.type for b in whole.content] == ["text"]
    assert whole.content[0].text == expected["choices"][0]["message"]["content"]
    usage = whole.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == expected["usage"]["prompt_tokens"]
    assert usage.output_tokens == expected["usage"]["completion_tokens"]
    assert whole.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[expected["choices"][0]["finish_reason"]]
    assert whole.id.startswith("msg_") and whole.role == "assistant" and whole.model == "smol"

    with client.messages.stream(model="smol", max_tokens=24, system="Answer briefly.",
                                messages=[{"role": "user", "content": "Name a fruit."}], extra_body=GREEDY) as stream:
        seen = list(stream)
        events = [e.type for e in seen]
        final = stream.get_final_message()
    # message_start's usage has the end's split (clients read input and cache use there; before, it
    # counted the restored prompt tokens as input): this prompt's prefix is cached by now
    started = seen[0].message.usage
    assert started.cache_read_input_tokens == final.usage.cache_read_input_tokens > 0
    assert started.input_tokens == final.usage.input_tokens
    assert final.content[0].text == whole.content[0].text and final.stop_reason == whole.stop_reason
    assert final.usage.output_tokens == usage.output_tokens
    raw = [e for e in events if e != "text"]  # the SDK adds its own text events
    assert raw[:2] == ["message_start", "content_block_start"]
    assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_system_blocks_turns_and_count_tokens(server, client):
    turns = [{"role": "user", "content": "Hi there"},
             {"role": "assistant", "content": [{"type": "text", "text": "Hello!"}]},
             {"role": "user", "content": [{"type": "text", "text": "Name "}, {"type": "text", "text": "a colour."}]}]
    system = [{"type": "text", "text": "Be terse."}, {"type": "text", "text": "Use English."}]
    chat_messages = [{"role": "system", "content": "Be terse.\n\nUse English."}, {"role": "user", "content": "Hi there"},
                     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a colour."}]
    counted = client.messages.count_tokens(model="smol", system=system, messages=turns)
    assert counted.input_tokens == tokens(server, chat_messages)
    expected = chat(server, chat_messages, max_tokens=16)
    got = client.messages.create(model="smol", max_tokens=16, system=system, messages=turns, extra_body=GREEDY)
    assert got.content[0].text == expected["choices"][0]["message"]["content"]


def test_tool_use_and_tool_result(server, client):
    called = client.messages.create(model="smol", max_tokens=100, tools=[WEATHER], messages=ASK, extra_body=GREEDY,
                                    tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert called.stop_reason == "tool_use" and [b.type for b in called.content] == ["tool_use"]
    use = called.content[0]
    assert use.name == "get_weather" and isinstance(use.input["city"], str) and use.id.startswith("toolu_")

    with client.messages.stream(model="smol", max_tokens=100, tools=[WEATHER], messages=ASK, extra_body=GREEDY,
                                tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        events = list(stream)
        streamed = stream.get_final_message()
    assert streamed.content[0].input == use.input and streamed.stop_reason == "tool_use"
    deltas = [e.delta.partial_json for e in events if e.type == "content_block_delta"]
    assert len(deltas) > 1 and json.loads("".join(deltas)) == use.input  # in pieces, as the input is written

    history = [*ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": use.id, "name": use.name,
                                                         "input": use.input}]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "22 C and sunny"}]}]
    answered = client.messages.create(model="smol", max_tokens=16, tools=[WEATHER], messages=history,
                                      extra_body=GREEDY)
    assert answered.content[0].type == "text" and answered.stop_reason in ("end_turn", "max_tokens")
    chat_history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [{"id": use.id, "type": "function",
                    "function": {"name": use.name, "arguments": json.dumps(use.input)}}]},
                    {"role": "tool", "tool_call_id": use.id, "content": "22 C and sunny"}]
    chat_tools = [{"type": "function", "function": {"name": WEATHER["name"], "description": WEATHER["description"],
                                                    "parameters": WEATHER["input_schema"]}}]
    assert client.messages.count_tokens(model="smol", tools=[WEATHER], messages=history).input_tokens == tokens(
        server, chat_history, tools=chat_tools)
    expected = chat(server, chat_history, tools=chat_tools, max_tokens=16)
    assert answered.content[0].text == expected["choices"][0]["message"]["content"]


def test_a_think_block_is_a_thinking_block(server, client):
    question = [{"role": "user", "content": "What is two plus two?"}]
    message = chat(server, question, model="qwen3-style", max_tokens=60, grammar=THINK)["choices"][0]["message"]
    got = client.messages.create(model="qwen3-style", max_tokens=60, messages=question,
                                 extra_body={**GREEDY, "grammar": THINK})
    assert [b.type for b in got.content] == ["thinking", "text"]
    assert got.content[0].thinking == message["reasoning_content"] and got.content[1].text == message["content"]
    with client.messages.stream(model="qwen3-style", max_tokens=60, messages=question,
                                extra_body={**GREEDY, "grammar": THINK}) as stream:
        events = list(stream)
        final = stream.get_final_message()
    thought = "".join(e.delta.thinking for e in events if e.type == "content_block_delta"
                      and e.delta.type == "thinking_delta")
    assert thought == message["reasoning_content"] and final.content[1].text == message["content"]
    # thinking disabled: the template's enable_thinking is false (Qwen3's closed empty block)
    off = client.messages.count_tokens(model="qwen3-style", messages=question, thinking={"type": "disabled"})
    on = client.messages.count_tokens(model="qwen3-style", messages=question)
    closed = httpx.post(server.base + "/tokenize", headers=AUTH, json={
        "model": "qwen3-style", "messages": question, "chat_template_kwargs": {"enable_thinking": False}}).json()
    assert off.input_tokens == closed["count"] > on.input_tokens


def test_stop_sequences_and_max_tokens(client):
    free = client.messages.create(model="smol", max_tokens=40, messages=[{"role": "user", "content": "Name a fruit."}],
                                  extra_body=GREEDY).content[0].text
    letter = next(c for c in free[3:] if c.isalpha())
    cut = client.messages.create(model="smol", max_tokens=40, stop_sequences=["zzz", letter],
                                 messages=[{"role": "user", "content": "Name a fruit."}], extra_body=GREEDY)
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == letter
    assert cut.content[0].text == free[:free.index(letter, 3)]
    short = client.messages.create(model="smol", max_tokens=3, messages=[{"role": "user", "content": "Tell a story."}],
                                   extra_body=GREEDY)
    assert short.stop_reason == "max_tokens" and short.usage.output_tokens == 3


@pytest.mark.parametrize("body,param", [
    ({"messages": ASK}, "max_tokens"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
     "messages[0].content[0].type"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}]},
     "messages[0].content[0].type"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
     "messages[0].content[0].tool_use_id"),
    ({"max_tokens": 8, "messages": ASK, "tools": [{"type": "web_search_20250305", "name": "web_search"}]},
     "tools[0].type"),
    ({"max_tokens": 8, "messages": ASK, "tools": [{**WEATHER, "input_schema": {
        "type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}}}]},
     "tools[0].input_schema.properties.n.multipleOf"),
    ({"max_tokens": 8, "messages": ASK, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
     "tool_choice.name"),
    ({"max_tokens": 8, "messages": ASK, "tool_choice": {"type": "sometimes"}}, "tool_choice"),
    ({"max_tokens": 8, "messages": ASK, "thinking": {"type": "maybe"}}, "thinking.type"),
    ({"max_tokens": 8, "messages": ASK, "system": [{"type": "image"}]}, "system[0]"),
    ({"max_tokens": 100000, "messages": ASK}, "max_tokens"),
    ({"max_tokens": 8, "messages": ASK, "output_config": {"format": {"type": "text"}}}, "output_config.format.type"),
    ({"max_tokens": 8, "messages": ASK, "output_format": {"type": "json_schema"}}, "output_format.schema"),
    ({"max_tokens": 8, "messages": ASK, "output_config": {"format": {"type": "json_schema", "schema": {
        "type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}}}}},
     "output_config.format.schema.properties.n.multipleOf"),
    ({"max_tokens": 8, "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages[0].content[0].text"),
    # what Anthropic refuses and was answered as another conversation
    ({"max_tokens": 8, "messages": [{"role": "user", "content": ""}]}, "messages[0].content"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": []}]}, "messages[0].content"),
    ({"max_tokens": 8, "messages": [*ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                                              "input": [1, 2]}]}]},
     "messages[1].content[0].input"),
    ({"max_tokens": 8, "messages": [*ASK, {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f",
                                                                              "input": {}}]},
                                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "other",
                                                                  "content": "x"}]}]},
     "messages[2].content[0].tool_use_id"),
    ({"max_tokens": 8, "messages": ASK, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
    ({"max_tokens": 8, "messages": ASK, "thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
    ({"max_tokens": 8, "messages": ASK, "metadata": "x"}, "metadata"),
])
def test_bad_requests_get_anthropics_envelope_naming_the_field(server, body, param):
    r = httpx.post(server.base + "/v1/messages", headers={"x-api-key": KEY}, json={"model": "smol", **body})
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    assert r.json()["error"]["param"] == param, r.json()
    # the message names the field as this API does (it said tools[0].function.parameters...)
    assert "function.parameters" not in r.json()["error"]["message"] and "response_format" not in r.json()["error"]["message"]


def test_structured_output_is_the_chat_routes_with_that_response_format(server):
    """output_config.format (and the beta's output_format): the text block is JSON of the schema,
    the same greedy answer as chat's response_format; with tools, a call or that JSON."""
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
              "additionalProperties": False}
    ask = [{"role": "user", "content": "Which city is the capital of Norway? Answer as JSON."}]
    expected = chat(server, ask, max_tokens=40, response_format={
        "type": "json_schema", "json_schema": {"name": "output", "schema": schema}})["choices"][0]["message"]["content"]
    assert list(json.loads(expected)) == ["city"]
    for shape in ({"output_config": {"format": {"type": "json_schema", "schema": schema}}},
                  {"output_format": {"type": "json_schema", "schema": schema}}):
        r = httpx.post(server.base + "/v1/messages", headers={"x-api-key": KEY}, timeout=300,
                       json={"model": "smol", "max_tokens": 40, "temperature": 0, "messages": ask, **shape})
        assert r.status_code == 200, r.text
        assert [b["text"] for b in r.json()["content"] if b["type"] == "text"] == [expected]
    r = httpx.post(server.base + "/v1/messages", headers={"x-api-key": KEY}, timeout=300, json={
        "model": "smol", "max_tokens": 60, "temperature": 0, "messages": ask, "tools": [WEATHER],
        "output_config": {"format": {"type": "json_schema", "schema": schema}}})
    assert r.status_code == 200, r.text
    blocks = r.json()["content"]
    if r.json()["stop_reason"] == "tool_use":
        assert [b["name"] for b in blocks if b["type"] == "tool_use"] == ["get_weather"]
    else:
        assert list(json.loads("".join(b["text"] for b in blocks if b["type"] == "text"))) == ["city"]


def test_keys_and_unknown_models(server, client):
    r = httpx.post(server.base + "/v1/messages", headers={"x-api-key": "wrong-key-here"},
                   json={"model": "smol", "max_tokens": 4, "messages": ASK})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError) as e:
        client.messages.create(model="nope", max_tokens=4, messages=ASK)
    assert e.value.body["error"]["type"] == "not_found_error"
    # x-api-key works on the other routes too
    assert httpx.get(server.base + "/v1/models", headers={"x-api-key": KEY}).json()["object"] == "list"
    listed = client.models.list()  # the SDK sends anthropic-version: the list comes in Anthropic's form
    assert [m.id for m in listed.data] == ["smol", "qwen3-style"] and listed.data[0].type == "model"
    assert listed.data[0].max_input_tokens == 2048 and not listed.has_more
    assert client.models.retrieve("smol") == listed.data[0]
    with pytest.raises(anthropic.NotFoundError) as e:
        client.models.retrieve("nope")
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "not_found_error"
    # paged as Anthropic pages it (every model came back whatever limit and the cursors said)
    first = client.models.list(limit=1)
    assert [m.id for m in first.data] == ["smol"] and first.has_more and first.last_id == "smol"
    assert [m.id for m in client.models.list(limit=1, after_id="smol").data] == ["qwen3-style"]
    assert not client.models.list(limit=1, after_id="smol").has_more
    assert [m.id for m in client.models.list(before_id="qwen3-style").data] == ["smol"]
    assert [m.id for m in client.models.list(limit=1).iter_pages() for m in m.data] == ["smol", "qwen3-style"]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.models.list(after_id="nope")
    assert e.value.body["error"]["param"] == "after_id"
    # a refused key on the models routes too (it came in OpenAI's envelope, a 401 typed
    # invalid_request_error)
    for path in ("/v1/models", "/v1/models/smol"):
        r = httpx.get(server.base + path, headers={"x-api-key": "wrong-key-here", "anthropic-version": "2023-06-01"})
        assert r.status_code == 401 and r.json()["type"] == "error", r.text
        assert r.json()["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.base, api_key="wrong-key-here").models.list()
    r = httpx.get(server.base + "/v1/models", headers={"x-api-key": "wrong-key-here"})  # OpenAI's clients: theirs
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
