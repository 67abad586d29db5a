"""Ollama's API through the real server and the official ollama client: /api/chat and /api/generate
answer as the chat completion of the same conversation (same prompt tokens, same answer, with
Ollama's sampling defaults), streamed as newline-delimited JSON; tools, format, think, logprobs;
/api/embed, /api/tags, /api/show, /api/ps, /api/version; the refused model-management calls."""

from __future__ import annotations

import json

import httpx
import ollama
import pytest

from conftest import SMOLLM2, model_entry
from reasoning_templates import QWEN3_STYLE, THINK

GREEDY = {"temperature": 0, "num_predict": 24}
ASK = [{"role": "user", "content": "Name a fruit."}]
WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory({"models": [
        model_entry("smol", SMOLLM2, n_parallel=2),
        model_entry("emb", SMOLLM2, n_ctx=512, n_parallel=1, embedding=True),
        model_entry("qwen3-style", SMOLLM2, n_parallel=1, chat_template=QWEN3_STYLE),
        model_entry("short", SMOLLM2, n_ctx=256, n_parallel=1),
    ]}, "ollama")


@pytest.fixture(scope="module")
def client(server) -> ollama.Client:
    return ollama.Client(host=server.base, timeout=300)


def chat(server, messages: list[dict], model: str = "smol", **kw) -> dict:
    r = httpx.post(server.base + "/v1/chat/completions", timeout=300, json={"model": model, "messages": messages, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def test_chat_is_the_chat_completion_whole_and_streamed(server, client):
    expected = chat(server, ASK, temperature=0, max_tokens=24)
    whole = client.chat(model="smol", messages=ASK, options=GREEDY)
    assert whole.message.role == "assistant" and whole.message.content == expected["choices"][0]["message"]["content"]
    assert whole.prompt_eval_count == expected["usage"]["prompt_tokens"]
    assert whole.eval_count == expected["usage"]["completion_tokens"] and whole.done
    assert whole.done_reason == expected["choices"][0]["finish_reason"]
    assert whole.total_duration >= whole.prompt_eval_duration + whole.eval_duration > 0
    parts = list(client.chat(model="smol:latest", messages=ASK, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].message.content == ""
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert parts[-1].eval_count == whole.eval_count
    with httpx.stream("POST", server.base + "/api/chat", json={"model": "smol", "messages": ASK, "options": GREEDY},
                      timeout=300) as r:  # streamed by default, one JSON object a line
        assert r.headers["content-type"] == "application/x-ndjson"
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert len(lines) == len(parts) and lines[-1]["done_reason"] == whole.done_reason
    # a stop string in the first token's text: no text comes out, and eval_duration (what clients
    # divide eval_count by) is still the generation's time, not 0
    eaten = client.chat(model="smol", messages=ASK, options={**GREEDY, "stop": [whole.message.content[:2]]})
    assert eaten.message.content == "" and eaten.eval_count == 1
    assert eaten.eval_duration > 0 and eaten.prompt_eval_duration > 0


def test_ollamas_sampling_defaults_apply_where_options_do_not_say(server, client):
    expected = chat(server, ASK, temperature=0.8, top_k=40, top_p=0.9, seed=7, max_tokens=24)
    got = client.chat(model="smol", messages=ASK, options={"seed": 7, "num_predict": 24, "num_ctx": 8192})
    assert got.message.content == expected["choices"][0]["message"]["content"]  # num_ctx is ignored


def test_generate_templated_and_raw(server, client):
    expected = chat(server, [{"role": "system", "content": "Be brief."}, *ASK], temperature=0, max_tokens=24)
    got = client.generate(model="smol", system="Be brief.", prompt="Name a fruit.", options=GREEDY)
    assert got.response == expected["choices"][0]["message"]["content"]
    assert got.prompt_eval_count == expected["usage"]["prompt_tokens"]
    streamed = list(client.generate(model="smol", system="Be brief.", prompt="Name a fruit.", options=GREEDY,
                                    stream=True))
    assert "".join(p.response for p in streamed) == got.response
    completion = httpx.post(server.base + "/v1/completions", timeout=300, json={
        "model": "smol", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}).json()
    raw = client.generate(model="smol", prompt="The capital of France is", raw=True,
                          options={"temperature": 0, "num_predict": 8})
    assert raw.response == completion["choices"][0]["text"]
    assert raw.prompt_eval_count == completion["usage"]["prompt_tokens"] and raw.done_reason == "length"


def test_tool_calls_and_tool_results(server, client):
    called = client.chat(model="smol", messages=[{"role": "user", "content": "Weather in Paris?"}],
                         tools=WEATHER, options={"temperature": 0})
    calls = called.message.tool_calls
    assert calls and calls[0].function.name == "get_weather" and isinstance(calls[0].function.arguments["city"], str)
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"function": {"name": "get_weather", "arguments": calls[0].function.arguments}}]},
               {"role": "tool", "content": "22 C and sunny", "tool_name": "get_weather"}]
    answered = client.chat(model="smol", messages=history, tools=WEATHER, options=GREEDY)
    assert answered.message.content and not answered.message.tool_calls
    openai_history = [history[0], {"role": "assistant", "content": None, "tool_calls": [{
        "id": "call_1_0", "type": "function", "function": {"name": "get_weather",
                                                           "arguments": json.dumps(calls[0].function.arguments)}}]},
        {"role": "tool", "content": "22 C and sunny", "name": "get_weather"}]
    count = httpx.post(server.base + "/tokenize", json={"model": "smol", "messages": openai_history,
                                                        "tools": WEATHER}).json()["count"]
    assert answered.prompt_eval_count == count
    streamed = list(client.chat(model="smol", messages=[{"role": "user", "content": "Weather in Paris?"}],
                                tools=WEATHER, options={"temperature": 0}, stream=True))
    assert [c.function.name for p in streamed for c in p.message.tool_calls or []] == [c.function.name for c in calls]


def test_format_beside_tools_is_a_call_or_that_json(server, client):
    """format with tools: the answer is a call or JSON of the schema, as chat's response_format
    with tools answers the same conversation."""
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    ask = [{"role": "user", "content": "Which city is the capital of France? Answer as JSON."}]
    got = client.chat(model="smol", messages=ask, tools=WEATHER, format=schema, options=GREEDY)
    expected = chat(server, ask, tools=WEATHER, temperature=0, max_tokens=GREEDY["num_predict"], response_format={
        "type": "json_schema", "json_schema": {"name": "format", "schema": schema}})["choices"][0]["message"]
    if expected.get("tool_calls"):
        assert [c.function.name for c in got.message.tool_calls] == [c["function"]["name"] for c in expected["tool_calls"]]
    else:
        assert got.message.content == expected["content"] and "city" in json.loads(got.message.content)


def test_format_and_logprobs(client):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    person = json.loads(client.chat(model="smol", messages=[{"role": "user", "content": "Describe a person."}],
                                    format=schema, options={"temperature": 0}).message.content)
    assert isinstance(person["name"], str) and isinstance(person["age"], int)
    answer = client.generate(model="smol", prompt="Write a JSON object with a colour.", format="json",
                             options={"temperature": 0, "num_predict": 400})
    assert answer.done_reason == "stop" and isinstance(json.loads(answer.response), dict)
    scored = client.chat(model="smol", messages=ASK, options={"temperature": 0, "num_predict": 4}, logprobs=True,
                         top_logprobs=2)
    assert len(scored.logprobs) == scored.eval_count == 4
    assert "".join(e.token for e in scored.logprobs) == scored.message.content
    assert all(len(e.top_logprobs) == 2 for e in scored.logprobs)


def test_think(server, client):
    question = [{"role": "user", "content": "What is two plus two?"}]
    message = chat(server, question, model="qwen3-style", temperature=0, max_tokens=60,
                   grammar=THINK)["choices"][0]["message"]
    body = {"model": "qwen3-style", "messages": question, "think": True, "grammar": THINK,
            "options": {"temperature": 0, "num_predict": 60}}  # grammar (EIE's extension) makes SmolLM2 think
    r = httpx.post(server.base + "/api/chat", timeout=300, json={**body, "stream": False})
    assert r.status_code == 200, r.text
    assert r.json()["message"]["thinking"] == message["reasoning_content"]
    assert r.json()["message"]["content"] == message["content"]
    with httpx.stream("POST", server.base + "/api/chat", timeout=300, json=body) as s:
        pieces = [json.loads(line)["message"] for line in s.iter_lines() if line]
    assert "".join(p.get("thinking", "") for p in pieces) == message["reasoning_content"]
    assert "".join(p["content"] for p in pieces) == message["content"]
    off = client.chat(model="qwen3-style", messages=question, think=False, options={"temperature": 0, "num_predict": 4})
    closed = httpx.post(server.base + "/tokenize", json={"model": "qwen3-style", "messages": question,
                                                         "chat_template_kwargs": {"enable_thinking": False}}).json()
    assert off.prompt_eval_count == closed["count"]
    assert "thinking" in client.show("qwen3-style").capabilities


def test_models_listed_shown_and_running(server, client):
    listed = {m.model: m for m in client.list().models}
    assert set(listed) == {"smol", "emb", "qwen3-style", "short"}
    smol = listed["smol"]
    assert smol.size == SMOLLM2.stat().st_size and len(smol.digest) == 64
    assert (smol.details.format, smol.details.family, smol.details.parameter_size,
            smol.details.quantization_level) == ("gguf", "llama", "135M", "Q4_1")
    shown = client.show("smol")
    assert shown.capabilities == ["completion", "tools"] and "<|im_start|>" in shown.template
    assert shown.modelinfo["general.architecture"] == "llama" and shown.modelinfo["llama.context_length"] == 8192
    assert client.show("emb").capabilities == ["embedding"]
    running = {m.model: m for m in client.ps().models}
    assert set(running) == {"smol", "emb", "qwen3-style", "short"} and running["smol"].context_length == 2048
    assert running["smol"].size > smol.size // 2
    assert httpx.get(server.base + "/api/version").json()["version"]


def test_embeddings_are_the_v1_embeddings(server, client):
    expected = httpx.post(server.base + "/v1/embeddings", json={"model": "emb", "input": ["hello", "world"]}).json()
    got = client.embed(model="emb", input=["hello", "world"])
    assert got.embeddings == [d["embedding"] for d in expected["data"]]
    assert got.prompt_eval_count == expected["usage"]["prompt_tokens"]
    assert client.embeddings(model="emb", prompt="hello").embedding == expected["data"][0]["embedding"]
    # an input longer than the model takes loses its end unless truncate is false, as Ollama's
    # does (every long input was a 400)
    long = "hello " * 600
    ids = httpx.post(server.base + "/tokenize", json={"model": "emb", "content": long}).json()["tokens"]
    cut = client.embed(model="emb", input=long)
    assert cut.prompt_eval_count == 512 < len(ids)
    first = httpx.post(server.base + "/v1/embeddings", json={"model": "emb", "input": ids[:512]}).json()
    assert cut.embeddings[0] == first["data"][0]["embedding"]
    r = httpx.post(server.base + "/api/embed", json={"model": "emb", "input": long, "truncate": False})
    assert r.status_code == 400 and r.json()["param"] == "input", r.text


def test_a_model_load_and_the_refusals(server, client):
    loaded = client.chat(model="smol", messages=[])
    assert loaded.done and loaded.done_reason == "load"
    with pytest.raises(ollama.ResponseError) as e:
        client.pull("llama3.2")
    assert e.value.status_code == 400 and "config" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="nope", messages=ASK)
    assert e.value.status_code == 404 and "nope" in e.value.error
    for body, param in (({"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, "messages[0].images"),
                        ({"messages": ASK, "format": "yaml"}, "format"),
                        ({"messages": ASK, "options": {"num_predict": 0}}, "options.num_predict"),
                        ({"messages": ASK, "format": {"type": "number", "multipleOf": 2}}, "format.multipleOf"),
                        ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role")):
        r = httpx.post(server.base + "/api/chat", json={"model": "smol", "stream": False, **body})
        assert r.status_code == 400 and r.json()["param"] == param, (body, r.text)
        assert isinstance(r.json()["error"], str)
    r = httpx.post(server.base + "/api/generate", json={"model": "smol", "prompt": "x", "suffix": "y"})
    assert r.status_code == 400 and r.json()["param"] == "suffix"


def test_num_predict_is_a_most_not_a_demand(server, client):
    # past the context's room the answer ends at the context (done_reason length), as Ollama's
    # does; it was a 400 for every request of a client whose num_predict passed n_ctx
    options = {"num_predict": 4096, "temperature": 0}
    got = client.generate(model="short", prompt="1, 2, 3, 4, 5, 6,", raw=True, options=options)
    assert got.done_reason == "length" and got.prompt_eval_count + got.eval_count == 256, got
    story = [{"role": "user", "content": "Write a long story about the sea."}]
    answer = client.chat(model="short", messages=story, options=options)
    assert answer.done_reason == "length" and answer.prompt_eval_count + answer.eval_count == 256


def test_an_answer_cut_short_in_its_calls_keeps_the_whole_ones_asked_whole_too(server, client):
    # SmolLM2 writes call after call until num_predict cuts one: the stream carried the closed
    # ones; the whole answer was their JSON envelope as the message's text
    ask = {"model": "smol", "messages": [{"role": "user", "content": "Say hello in JSON"}], "tools": WEATHER,
           "options": {"temperature": 0, "num_predict": 60}}
    whole = client.chat(**ask)
    streamed = list(client.chat(**ask, stream=True))
    assert whole.done_reason == "length" and whole.message.content == "", whole
    calls = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
    assert calls and calls == [(c.function.name, c.function.arguments) for p in streamed
                               for c in p.message.tool_calls or []]
    message = httpx.post(server.base + "/v1/messages", timeout=120, json={
        "model": "smol", "messages": ask["messages"], "max_tokens": 60, "temperature": 0,
        "tools": [{"name": "get_weather", "description": "The weather in a city",
                   "input_schema": WEATHER[0]["function"]["parameters"]}]}).json()
    assert message["stop_reason"] == "max_tokens" and message["content"], message
    assert all(b["type"] == "tool_use" for b in message["content"]), message


def test_head_is_get_without_a_body_and_the_root_is_ollamas_heartbeat(server):
    # the ollama CLI asks HEAD / first, load balancers HEAD /health: both were 404 or 405
    root = httpx.get(server.base + "/")
    assert root.status_code == 200 and root.text == "Ollama is running"
    for path in ("/", "/health", "/api/tags", "/api/version", "/v1/models"):
        head, get = httpx.head(server.base + path), httpx.get(server.base + path)
        assert head.status_code == get.status_code == 200 and head.content == b"", path
        assert head.headers["content-type"] == get.headers["content-type"], path
    r = httpx.head(server.base + "/api/chat")  # a POST route: 405 naming what it takes
    assert r.status_code == 405 and r.headers["allow"] == "POST"


def test_bodies_ollama_takes_are_taken(server):
    # integer options as JSON floats (Ollama reads numbers as float64), a null content on an
    # assistant turn that only calls tools, more than 16 stop strings and an empty one: all 400s
    base = {"model": "smol", "stream": False}
    r = httpx.post(server.base + "/api/generate", timeout=120, json={
        **base, "prompt": "Hi", "options": {"num_predict": 3.0, "seed": 42.0, "top_k": 40.0, "temperature": 0}})
    assert r.status_code == 200 and r.json()["eval_count"] <= 3, r.text
    history = [{"role": "user", "content": "Weather in Paris?"},
               {"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "get_weather",
                                                                                   "arguments": {"city": "Paris"}}}]},
               {"role": "tool", "content": "22 C", "tool_name": "get_weather"}]
    stops = [f"never-{i}" for i in range(20)] + [""]
    r = httpx.post(server.base + "/api/chat", timeout=120, json={
        **base, "messages": history, "tools": WEATHER, "options": {"num_predict": 4, "stop": stops, "temperature": 0}})
    assert r.status_code == 200 and r.json()["done"], r.text
    r = httpx.post(server.base + "/api/generate", json={**base, "prompt": "Hi", "options": {"num_predict": 3.5}})
    assert r.status_code == 400 and r.json()["param"] == "options.num_predict", r.text
