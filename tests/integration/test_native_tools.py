"""Tool calls in a model's own format (api/native_tools.py), through the real server: a SmolLM2
copy whose vocabulary has `<tool_call>` as one token, served with a Hermes-style template (the
format of Qwen 2.5/3 and Hermes models; tests/hermes_smollm2.py). The template lists the tools,
the answer is `<tool_call>{...}</tool_call>` held by a grammar (lazy under `auto`: it starts at
the model's own tag), and history renders as the template writes it. The same template on
SmolLM2 as it is (no such token) falls back to EIE's JSON format."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import SMOLLM2, model_entry
from hermes_smollm2 import HERMES_TEMPLATE, TOOL_CALL_TOKEN, write_hermes_smollm2
from tool_requests import TOOLS, WEATHER

CALL_FIRST = {str(TOOL_CALL_TOKEN): 100}  # under auto the untrained model is made to open a call


@pytest.fixture(scope="module")
def server(server_factory, tmp_path_factory):
    hermes = write_hermes_smollm2(tmp_path_factory.mktemp("hermes") / "smollm2-hermes.gguf")
    return server_factory({
        "inference": {"speculative": {"sources": ["ngram", "history"]}},
        "models": [model_entry("hermes", hermes, n_parallel=2, chat_template=HERMES_TEMPLATE),
                   model_entry("no-tag", SMOLLM2, n_parallel=1, chat_template=HERMES_TEMPLATE)],
    }, "native-tools")


def chat(server, messages: list, model: str = "hermes", **kw) -> httpx.Response:
    return httpx.post(server.base + "/v1/chat/completions", timeout=300, json={
        "model": model, "messages": messages, "tools": TOOLS, "temperature": 0, "max_tokens": 80, **kw})


def tokens(server, **body) -> dict:
    r = httpx.post(server.base + "/tokenize", json={"model": "hermes", "with_pieces": True, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def prompt_text(server, **body) -> str:
    return "".join(t["piece"] for t in tokens(server, **body)["tokens"])


def check_weather(call: dict) -> None:
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    args = json.loads(call["function"]["arguments"])
    assert list(args) == ["city", "unit"] and args["unit"] in ("celsius", "fahrenheit"), args


def test_the_template_lists_the_tools_and_the_prompt_is_what_the_chat_renders(server):
    text = prompt_text(server, messages=WEATHER, tools=TOOLS)
    assert text.startswith("<|im_start|>system\nYou can call functions.")
    for tool in TOOLS:
        assert json.dumps(tool, ensure_ascii=False) + "\n" in text  # tojson as Hugging Face writes it
    assert "Reply with one JSON object" not in text  # not EIE's instructions
    r = chat(server, WEATHER, tool_choice="required", max_tokens=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == tokens(server, messages=WEATHER, tools=TOOLS)["count"]


def test_required_and_named_calls_come_in_the_models_format(server):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = chat(server, WEATHER, tool_choice=choice, parallel_tool_calls=False)
        assert r.status_code == 200, r.text
        out = r.json()["choices"][0]
        assert out["finish_reason"] == "tool_calls" and out["message"]["content"] is None, out
        (call,) = out["message"]["tool_calls"]
        if choice != "required":
            check_weather(call)
        else:
            assert call["function"]["name"] in ("get_weather", "add")
            json.loads(call["function"]["arguments"])


def test_auto_is_free_until_the_model_opens_a_call(server):
    """Without the tag the answer is the model's text, the same as with no grammar at all; once
    the model picks `<tool_call>` the rest is held to the call's grammar."""
    free = chat(server, WEATHER, max_tokens=30).json()["choices"][0]
    assert free["finish_reason"] in ("stop", "length") and "tool_calls" not in free["message"]
    # the grammar is lazy: until the tag, the answer is what the prompt alone gives
    prompt = [t["id"] for t in tokens(server, messages=WEATHER, tools=TOOLS)["tokens"]]
    same = httpx.post(server.base + "/v1/completions", timeout=300, json={
        "model": "hermes", "prompt": prompt, "temperature": 0, "max_tokens": 30}).json()["choices"][0]["text"]
    assert free["message"]["content"] == same
    # `add` only: its call has no free string, where the tag (pushed up everywhere) is valid text
    called = chat(server, WEATHER, tools=[TOOLS[1]], logit_bias=CALL_FIRST, parallel_tool_calls=False)
    out = called.json()["choices"][0]
    assert out["finish_reason"] == "tool_calls" and out["message"]["content"] is None, out
    (call,) = out["message"]["tool_calls"]
    assert call["function"]["name"] == "add"
    assert {k: type(v) for k, v in json.loads(call["function"]["arguments"]).items()} == {"a": int, "b": int}


def test_a_streamed_call_arrives_whole_and_no_tag_leaks_into_the_content(server):
    body = {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 80}
    whole = chat(server, WEATHER, **body).json()["choices"][0]
    chunks = []
    with httpx.stream("POST", server.base + "/v1/chat/completions", timeout=300, json={
            "model": "hermes", "messages": WEATHER, "tools": TOOLS, "temperature": 0, "stream": True, **body}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:])["choices"][0])
    calls = [c["delta"]["tool_calls"] for c in chunks if c["delta"].get("tool_calls")]
    assert len(calls) == 1 and chunks[-1]["finish_reason"] == "tool_calls"
    assert calls[0][0]["function"] == whole["message"]["tool_calls"][0]["function"]
    check_weather(calls[0][0])
    assert not any("<tool_call>" in (c["delta"].get("content") or "") for c in chunks)


def test_history_renders_as_the_template_writes_calls_and_results(server):
    messages = [*WEATHER,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]
    text = prompt_text(server, messages=messages, tools=TOOLS)
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "unit": "celsius"}}\n</tool_call>\n<|im_end|>') in text
    assert "<|im_start|>user\n<tool_response>\n18 degrees, sunny\n</tool_response><|im_end|>" in text
    r = chat(server, messages, tool_choice="none", max_tokens=20)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text


def test_a_vocabulary_without_the_tag_gets_eies_format(server):
    r = chat(server, WEATHER, model="no-tag", tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.status_code == 200, r.text
    out = r.json()["choices"][0]
    assert out["finish_reason"] == "tool_calls"
    check_weather(out["message"]["tool_calls"][0])
    text = "".join(t["piece"] for t in httpx.post(server.base + "/tokenize", timeout=60, json={
        "model": "no-tag", "messages": WEATHER, "tools": TOOLS, "with_pieces": True}).json()["tokens"])
    assert "Reply with one JSON object" in text and "<tools>" not in text


def test_tools_in_tokenize_need_messages(server):
    r = httpx.post(server.base + "/tokenize", json={"model": "hermes", "content": "x", "tools": TOOLS})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


def test_the_model_list_names_each_models_tool_format(server):
    cards = {c["id"]: c for c in httpx.get(server.base + "/v1/models").json()["data"]}
    assert cards["hermes"]["tool_format"] == "hermes" and cards["no-tag"]["tool_format"] == "eie"
