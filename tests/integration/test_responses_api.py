"""OpenAI's Responses API (POST /v1/responses, the stored responses) through the real server and the
official OpenAI SDK: a response is the chat completion of the same conversation (same prompt
tokens, same greedy answer), streamed and whole alike; previous_response_id continues a
conversation; tools, structured output, think blocks and logprobs take the chat route's paths."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from conftest import SMOLLM2, model_entry
from reasoning_templates import QWEN3_STYLE, THINK

KEY, OTHER = "responses-key-one", "responses-key-two"
AUTH = {"Authorization": f"Bearer {KEY}"}
WEATHER = [{"type": "function", "name": "get_weather", "description": "The weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory({
        "server": {"api_keys": [KEY, OTHER]},
        "models": [model_entry("smol", SMOLLM2, n_parallel=2),
                   model_entry("qwen3-style", SMOLLM2, n_parallel=1, chat_template=QWEN3_STYLE)],
    }, "responses")


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base + "/v1", api_key=KEY, max_retries=0, timeout=300)


def chat(server, messages: list[dict], **kw) -> dict:
    r = httpx.post(server.base + "/v1/chat/completions", headers=AUTH, timeout=300, json={
        "model": "smol", "messages": messages, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def post(server, key: str = KEY, **body) -> httpx.Response:
    return httpx.post(server.base + "/v1/responses", headers={"Authorization": f"Bearer {key}"}, timeout=300,
                      json={"model": "smol", "temperature": 0, **body})


def test_a_response_is_the_chat_answer_whole_and_streamed(server, client):
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a fruit."}]
    expected = chat(server, messages, max_tokens=24)
    whole = client.responses.create(model="smol", instructions="Answer briefly.", input="Name a fruit.",
                                    max_output_tokens=24, temperature=0)
    assert whole.output_text == expected["choices"][0]["message"]["content"]
    assert whole.usage.input_tokens == expected["usage"]["prompt_tokens"]
    assert whole.usage.output_tokens == expected["usage"]["completion_tokens"]
    assert whole.status == ("incomplete" if expected["choices"][0]["finish_reason"] == "length" else "completed")
    assert whole.id.startswith("resp_") and whole.model == "smol" and whole.instructions == "Answer briefly."
    assert [item.type for item in whole.output] == ["message"]

    with client.responses.stream(model="smol", instructions="Answer briefly.", input="Name a fruit.",
                                 max_output_tokens=24, temperature=0) as stream:
        events = list(stream)
        final = stream.get_final_response()
    assert final.output_text == whole.output_text and final.status == whole.status
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole.status}"]
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens


def test_input_items_are_the_chat_messages(server, client):
    """Messages in both forms, content parts, developer messages: the same prompt as the chat."""
    items = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be terse."}]},
             {"role": "user", "content": "Hi there"},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello!"}]},
             {"role": "user", "content": [{"type": "input_text", "text": "Name "}, {"type": "input_text", "text": "a colour."}]}]
    expected = chat(server, [{"role": "developer", "content": "Be terse."}, {"role": "user", "content": "Hi there"},
                             {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a colour."}],
                    max_tokens=16)
    got = client.responses.create(model="smol", input=items, max_output_tokens=16, temperature=0)
    assert got.usage.input_tokens == expected["usage"]["prompt_tokens"]
    assert got.output_text == expected["choices"][0]["message"]["content"]


def test_previous_response_id_continues_the_conversation(server, client):
    first = client.responses.create(model="smol", instructions="Answer in French.", input="Name a fruit.",
                                    max_output_tokens=12, temperature=0)
    second = client.responses.create(model="smol", previous_response_id=first.id, input="And a vegetable?",
                                     max_output_tokens=12, temperature=0)
    # the earlier turns without the earlier instructions (they are not carried over)
    expected = chat(server, [{"role": "user", "content": "Name a fruit."},
                             {"role": "assistant", "content": first.output_text},
                             {"role": "user", "content": "And a vegetable?"}], max_tokens=12)
    assert second.usage.input_tokens == expected["usage"]["prompt_tokens"]
    assert second.output_text == expected["choices"][0]["message"]["content"]
    assert second.previous_response_id == first.id
    third = client.responses.create(model="smol", previous_response_id=second.id, input="Thanks.",
                                    max_output_tokens=8, temperature=0)
    assert third.usage.input_tokens > second.usage.input_tokens + second.usage.output_tokens
    assert third.usage.input_tokens_details.cached_tokens > 0  # the conversation's saved context


def test_stored_responses_are_read_listed_and_deleted(server, client):
    made = client.responses.create(model="smol", input=[{"role": "user", "content": f"Item {i}"} for i in range(5)],
                                   max_output_tokens=4, temperature=0, metadata={"run": "store-test"})
    got = client.responses.retrieve(made.id)
    assert got.model_dump() == made.model_dump() and got.metadata == {"run": "store-test"}
    listed = client.responses.input_items.list(made.id, order="asc")
    texts = [item.content[0].text for item in listed.data]
    assert texts == [f"Item {i}" for i in range(5)] and listed.has_more is False
    newest = client.responses.input_items.list(made.id, limit=2)
    assert [item.content[0].text for item in newest.data] == ["Item 4", "Item 3"] and newest.has_more
    rest = httpx.get(f"{server.base}/v1/responses/{made.id}/input_items", headers=AUTH,
                     params={"after": newest.last_id, "order": "desc"}).json()
    assert [item["content"][0]["text"] for item in rest["data"]] == ["Item 2", "Item 1", "Item 0"]

    other = httpx.get(f"{server.base}/v1/responses/{made.id}", headers={"Authorization": f"Bearer {OTHER}"})
    assert other.status_code == 404  # another key's response
    assert post(server, key=OTHER, previous_response_id=made.id, input="Go on").status_code == 400

    client.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    gone = post(server, previous_response_id=made.id, input="Go on")
    assert gone.status_code == 400 and gone.json()["error"]["param"] == "previous_response_id"
    assert gone.json()["error"]["code"] == "previous_response_not_found"

    unstored = client.responses.create(model="smol", input="Hi", max_output_tokens=2, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    metrics = httpx.get(server.base + "/metrics").text
    assert 'endpoint="/v1/responses/{response_id}"' in metrics and made.id not in metrics


def test_input_tokens_counts_the_prompt_a_response_would_have(server, client):
    """POST /v1/responses/input_tokens: the input_tokens a response to the same request reports,
    with instructions and tools, and after previous responses."""
    ask = {"model": "smol", "instructions": "Answer briefly.", "input": "What is the weather in Paris?",
           "tools": WEATHER}
    counted = client.responses.input_tokens.count(**ask)
    assert counted.object == "response.input_tokens"
    made = client.responses.create(max_output_tokens=8, temperature=0, **ask)
    assert counted.input_tokens == made.usage.input_tokens
    assert client.responses.input_tokens.count(model="smol", input="Hi").input_tokens < counted.input_tokens
    after = {"model": "smol", "previous_response_id": made.id, "input": "And in Rome?"}
    counted_after = client.responses.input_tokens.count(**after)
    assert counted_after.input_tokens == client.responses.create(max_output_tokens=4, temperature=0,
                                                                 **after).usage.input_tokens
    alone = client.responses.input_tokens.count(model="smol", input="And in Rome?")
    assert counted_after.input_tokens > alone.input_tokens  # the earlier turns are in it
    for body, param in (({"input": "Hi"}, "model"), ({"model": "nope", "input": "Hi"}, "model"),
                        ({"model": "smol", "input": "Hi", "previous_response_id": "resp_none"},
                         "previous_response_id")):
        r = httpx.post(server.base + "/v1/responses/input_tokens", headers=AUTH, json=body)
        assert r.status_code in (400, 404) and r.json()["error"]["param"] == param, r.text


def test_function_calls_and_their_outputs(server, client):
    called = client.responses.create(model="smol", input="What is the weather in Paris?", tools=WEATHER,
                                     tool_choice="required", parallel_tool_calls=False, temperature=0)
    calls = [item for item in called.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and called.status == "completed"
    assert isinstance(json.loads(calls[0].arguments)["city"], str)
    assert calls[0].call_id.startswith("call_") and calls[0].id.startswith("fc_")

    with client.responses.stream(model="smol", input="What is the weather in Paris?", tools=WEATHER,
                                 tool_choice="required", parallel_tool_calls=False, temperature=0) as stream:
        events = list(stream)
        streamed = stream.get_final_response()
    assert [(i.name, i.arguments) for i in streamed.output] == [(calls[0].name, calls[0].arguments)]
    kinds = [e.type for e in events]  # the item opens, its arguments come in pieces as they are written
    assert kinds[0:2] == ["response.created", "response.in_progress"] and kinds[2] == "response.output_item.added"
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(pieces) > 1 and "".join(pieces) == calls[0].arguments
    assert kinds[3:] == ["response.function_call_arguments.delta"] * len(pieces) + [
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]

    events = list(client.responses.create(model="smol", input="What is the weather in Paris?", tools=WEATHER,
                                          tool_choice="required", parallel_tool_calls=False, temperature=0,
                                          max_output_tokens=16, stream=True))  # cut short inside the call
    assert events[-1].type == "response.incomplete"
    cut = events[-1].response
    assert cut.status == "incomplete" and [(i.type, i.status) for i in cut.output] == [("function_call", "incomplete")]
    assert calls[0].arguments.startswith(cut.output[0].arguments) and cut.output[0].arguments != calls[0].arguments

    answered = client.responses.create(
        model="smol", previous_response_id=called.id, tools=WEATHER, max_output_tokens=16, temperature=0,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "22 C and sunny"}])
    assert answered.output[0].type == "message" and answered.output_text
    # the same conversation in chat terms renders the same prompt
    history = [{"role": "user", "content": "What is the weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [{"id": calls[0].call_id, "type": "function",
                "function": {"name": "get_weather", "arguments": calls[0].arguments}}]},
               {"role": "tool", "tool_call_id": calls[0].call_id, "content": "22 C and sunny"}]
    tools = [{"type": "function", "function": {k: v for k, v in WEATHER[0].items() if k != "type"}}]
    count = httpx.post(server.base + "/tokenize", headers=AUTH, json={
        "model": "smol", "messages": history, "tools": tools}).json()["count"]
    assert answered.usage.input_tokens == count
    # an input that names the call itself, without previous_response_id
    inline = client.responses.create(
        model="smol", tools=WEATHER, max_output_tokens=16, temperature=0,
        input=[{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
                "arguments": calls[0].arguments},
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": "22 C and sunny"}])
    assert inline.usage.input_tokens == count and inline.output_text == answered.output_text


def test_structured_output_and_logprobs(client):
    shaped = client.responses.create(model="smol", input="Describe a person.", temperature=0,
                                     text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}})
    person = json.loads(shaped.output_text)
    assert isinstance(person["name"], str) and isinstance(person["age"], int)
    assert shaped.text.format.type == "json_schema"

    scored = client.responses.create(model="smol", input="Hi", max_output_tokens=4, temperature=0, top_logprobs=2,
                                     include=["message.output_text.logprobs"])
    entries = scored.output[0].content[0].logprobs
    assert len(entries) == scored.usage.output_tokens
    assert "".join(e.token for e in entries) == scored.output_text
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.logprob - 1e-6 for e in entries)
    plain = client.responses.create(model="smol", input="Hi", max_output_tokens=4, temperature=0)
    assert plain.output[0].content[0].logprobs == []


def test_a_think_block_is_a_reasoning_item(server, client):
    r = httpx.post(server.base + "/v1/chat/completions", headers=AUTH, timeout=300, json={
        "model": "qwen3-style", "messages": [{"role": "user", "content": "What is two plus two?"}],
        "temperature": 0, "max_tokens": 60, "grammar": THINK})
    message = r.json()["choices"][0]["message"]
    got = client.responses.create(model="qwen3-style", input="What is two plus two?", max_output_tokens=60,
                                  temperature=0, extra_body={"grammar": THINK})
    assert [item.type for item in got.output] == ["reasoning", "message"]
    assert got.output[0].content[0].text == message["reasoning_content"]
    assert got.output_text == message["content"]
    assert 0 < got.usage.output_tokens_details.reasoning_tokens < got.usage.output_tokens
    with client.responses.stream(model="qwen3-style", input="What is two plus two?", max_output_tokens=60,
                                 temperature=0, extra_body={"grammar": THINK}) as stream:
        events = list(stream)
        final = stream.get_final_response()
    thought = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert thought == message["reasoning_content"] and final.output_text == message["content"]
    assert [item.type for item in final.output] == ["reasoning", "message"]
    # reasoning.effort none: the template's enable_thinking is false (Qwen3's closed empty block)
    off = client.responses.create(model="qwen3-style", input="What is two plus two?", max_output_tokens=4,
                                  reasoning={"effort": "none"})
    closed = httpx.post(server.base + "/tokenize", headers=AUTH, json={
        "model": "qwen3-style", "messages": [{"role": "user", "content": "What is two plus two?"}],
        "chat_template_kwargs": {"enable_thinking": False}}).json()
    assert off.usage.input_tokens == closed["count"] > got.usage.input_tokens


def test_an_answer_cut_short_is_incomplete(client):
    got = client.responses.create(model="smol", input="Write a long story.", max_output_tokens=5, temperature=0)
    assert got.status == "incomplete" and got.incomplete_details.reason == "max_output_tokens"
    assert got.usage.output_tokens == 5 and got.output[0].status == "incomplete"


@pytest.mark.parametrize("body,param", [
    ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"},
                                             {"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[1].type"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "robot", "content": "Hi"}]}, "input[0].role"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": []}, "input"),
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "Hi", "tools": [{"type": "function", "name": "f", "parameters": {
        "type": "object", "properties": {"n": {"type": "number", "multipleOf": 3}}}}]},
     "tools[0].parameters.properties.n.multipleOf"),
    ({"input": "Hi", "tool_choice": {"type": "function", "name": "missing"}, "tools": WEATHER}, "tool_choice.name"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x", "schema": {
        "type": "object", "properties": {"n": {"type": "number", "multipleOf": 3}}}}}},
     "text.format.schema.properties.n.multipleOf"),
    ({"input": "Hi", "text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"input": "Hi", "background": True, "store": False}, "background"),
    ({"input": "Hi", "truncation": "some"}, "truncation"),
    ({"input": "Hi", "include": ["reasoning.encrypted_content"]}, "include"),
    ({"input": "Hi", "max_output_tokens": 100000}, "max_output_tokens"),
    ({"input": "Hi", "previous_response_id": "resp_nothing"}, "previous_response_id"),
    ({"input": "Hi", "temperature": 3}, "temperature"),
])
def test_bad_requests_name_the_field(server, body, param):
    r = post(server, **body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


def test_unknown_model_and_response(server):
    r = post(server, model="nope", input="Hi")
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    for method, path in (("GET", "/v1/responses/resp_x"), ("DELETE", "/v1/responses/resp_x"),
                         ("GET", "/v1/responses/resp_x/input_items")):
        r = httpx.request(method, server.base + path, headers=AUTH)
        assert r.status_code == 404 and r.json()["error"]["code"] == "response_not_found", (path, r.text)
    assert httpx.get(server.base + "/v1/responses/resp_x").status_code == 401
    assert httpx.put(server.base + "/v1/responses/resp_x", headers=AUTH).status_code == 405


def test_a_conversation_continues_across_a_restart(server_factory, tmp_path):
    """Stored responses are written under the state directory and read back at start."""
    config = {"server": {"state_dir": str(tmp_path)}, "models": [model_entry("smol", SMOLLM2, n_parallel=1)]}
    first = server_factory(config, "responses-before")
    made = httpx.post(first.base + "/v1/responses", timeout=300, json={
        "model": "smol", "input": "Name a fruit.", "max_output_tokens": 8, "temperature": 0}).json()
    first.stop()
    assert (tmp_path / "responses" / f"{made['id']}.json").is_file()
    second = server_factory(config, "responses-after")
    assert httpx.get(f"{second.base}/v1/responses/{made['id']}").json() == made
    went_on = httpx.post(second.base + "/v1/responses", timeout=300, json={
        "model": "smol", "previous_response_id": made["id"], "input": "Another?", "max_output_tokens": 8,
        "temperature": 0})
    assert went_on.status_code == 200 and went_on.json()["usage"]["input_tokens"] > made["usage"]["input_tokens"]


def test_tools_with_a_text_format_answer_as_the_chat_route_does(server):
    """Tools and text.format together (what the Agents SDK sends for an agent with an output type):
    the answer is a call or the format's JSON, the same as chat's tools with response_format."""
    ask = "Describe Ann, who is 31, as JSON."
    r = post(server, input=ask, tools=WEATHER, max_output_tokens=60,
             text={"format": {"type": "json_schema", "name": "person", "schema": PERSON}})
    assert r.status_code == 200, r.text
    expected = chat(server, [{"role": "user", "content": ask}], max_tokens=60,
                    tools=[{"type": "function", "function": {k: v for k, v in WEATHER[0].items() if k != "type"}}],
                    response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
    message = expected["choices"][0]["message"]
    out = r.json()["output"]
    if message.get("tool_calls"):
        (call,) = [item for item in out if item["type"] == "function_call"]
        assert (call["name"], call["arguments"]) == (message["tool_calls"][0]["function"]["name"],
                                                     message["tool_calls"][0]["function"]["arguments"])
    else:
        (item,) = [item for item in out if item["type"] == "message"]
        text = item["content"][0]["text"]
        assert text == message["content"] and {"name", "age"} <= set(json.loads(text))
