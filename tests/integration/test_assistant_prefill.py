"""A last assistant message is the answer begun (a prefill) on Anthropic's Messages API and
Ollama's /api/chat, and on /v1/chat/completions with vLLM's `continue_final_message`: the prompt
ends where its text does (no end of turn, no new assistant header) and the answer is the model's
continuation only. Checked against a raw completion of the conversation rendered up to the
assistant's header plus the prefill, with both real models (Gemma's template trims the text)."""

from __future__ import annotations

import anthropic
import httpx
import pytest

MODELS = ["smollm2-135m", "gemma3-270m"]
ASK = [{"role": "user", "content": "Count from 1 to 10, separated by commas."}]
PREFILL = "1, 2, 3,"


def post(server, path: str, body: dict) -> dict:
    r = httpx.post(server.base + path, json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def continuation(server, model: str, prefill: str, max_tokens: int = 10) -> str:
    """The greedy continuation of the conversation rendered with its assistant header, then
    `prefill`, asked as a raw completion of its tokens."""
    text = post(server, "/apply-template", {"model": model, "messages": ASK})["prompt"] + prefill
    tokens = post(server, "/tokenize", {"model": model, "content": text, "parse_special": True,
                                        "add_special": not text.startswith("<bos>")})["tokens"]
    return post(server, "/v1/completions", {"model": model, "prompt": tokens, "max_tokens": max_tokens,
                                            "temperature": 0})["choices"][0]["text"]


@pytest.mark.parametrize("model", MODELS)
def test_anthropic_prefill_is_continued(main_server, model):
    expected = continuation(main_server, model, PREFILL)
    assert expected and not expected.lstrip().startswith("1"), expected
    client = anthropic.Anthropic(base_url=main_server.base, api_key="unused", max_retries=0, timeout=300)
    conversation = [*ASK, {"role": "assistant", "content": PREFILL}]
    message = client.messages.create(model=model, max_tokens=10, extra_body={"temperature": 0}, messages=conversation)
    assert message.content[0].text == expected
    with client.messages.stream(model=model, max_tokens=10, extra_body={"temperature": 0}, messages=conversation) as stream:
        assert "".join(stream.text_stream) == expected
    counted = client.messages.count_tokens(model=model, messages=conversation).input_tokens
    assert counted == message.usage.input_tokens + message.usage.cache_read_input_tokens < client.messages.count_tokens(
        model=model, messages=[*ASK, {"role": "assistant", "content": PREFILL}, {"role": "user", "content": "Go on"}]
    ).input_tokens
    # an empty prefill is no prefill: the answer starts afresh, as with none
    empty = client.messages.create(model=model, max_tokens=10, extra_body={"temperature": 0},
                                   messages=[*ASK, {"role": "assistant", "content": ""}])
    alone = client.messages.create(model=model, max_tokens=10, extra_body={"temperature": 0}, messages=ASK)
    assert empty.content[0].text == alone.content[0].text


@pytest.mark.parametrize("model", MODELS)
def test_ollama_continues_a_last_assistant_message(main_server, model):
    expected = continuation(main_server, model, PREFILL)
    r = post(main_server, "/api/chat", {"model": model, "stream": False, "options": {"temperature": 0, "num_predict": 10},
                                        "messages": [*ASK, {"role": "assistant", "content": PREFILL}]})
    assert r["message"]["content"] == expected


def test_openai_continue_final_message(main_server):
    model = "smollm2-135m"
    conversation = [*ASK, {"role": "assistant", "content": PREFILL}]
    expected = continuation(main_server, model, PREFILL)
    r = post(main_server, "/v1/chat/completions", {"model": model, "messages": conversation, "max_tokens": 10,
                                                   "temperature": 0, "continue_final_message": True})
    assert r["choices"][0]["message"]["content"] == expected
    shown = post(main_server, "/apply-template", {"model": model, "messages": conversation,
                                                  "continue_final_message": True})["prompt"]
    assert shown.endswith("<|im_start|>assistant\n" + PREFILL)
    # without it the assistant's message is a closed turn, as OpenAI reads it
    closed = post(main_server, "/apply-template", {"model": model, "messages": conversation})["prompt"]
    assert closed.endswith(PREFILL + "<|im_end|>\n<|im_start|>assistant\n")
    r = httpx.post(main_server.base + "/v1/chat/completions", timeout=60, json={
        "model": model, "messages": ASK, "continue_final_message": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message", r.text


def test_a_prefill_with_tools_in_eies_json_format_is_refused(main_server):
    """EIE's tool format writes the assistant's text as JSON, so an answer begun cannot be gone
    on from: a 400 naming it (it rendered the prefill closed inside the JSON)."""
    tool = {"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}
    r = httpx.post(main_server.base + "/v1/messages", timeout=60, json={
        "model": "smollm2-135m", "max_tokens": 8, "tools": [tool],
        "messages": [*ASK, {"role": "assistant", "content": PREFILL}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    r = httpx.post(main_server.base + "/v1/chat/completions", timeout=60, json={
        "model": "smollm2-135m", "max_tokens": 8, "continue_final_message": True,
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": tool["input_schema"]}}],
        "messages": [*ASK, {"role": "assistant", "content": PREFILL}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message", r.text
