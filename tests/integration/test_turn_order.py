"""Two user messages in a row on Gemma 3, whose template takes only alternating turns: every API
answers them as the one turn they make (before, a 400 "roles must alternate" on the Messages,
Responses, Conversations and Ollama APIs, so a conversation seeded with a user message and then
asked in could not be used with Gemma)."""

from __future__ import annotations

import httpx

MODEL = "gemma3-270m"
SPLIT = [{"role": "user", "content": "My name is Bob."}, {"role": "user", "content": "What is my name?"}]
JOINED = [{"role": "user", "content": "My name is Bob.\n\nWhat is my name?"}]


def post(server, path: str, body: dict) -> dict:
    r = httpx.post(server.base + path, json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_split_user_turns_are_one_turn_on_every_api(main_server):
    greedy = {"model": MODEL, "temperature": 0}
    expected = post(main_server, "/v1/chat/completions", {**greedy, "messages": JOINED, "max_tokens": 8})
    answer = expected["choices"][0]["message"]["content"]
    assert answer
    split = post(main_server, "/v1/chat/completions", {**greedy, "messages": SPLIT, "max_tokens": 8})
    assert split["choices"][0]["message"]["content"] == answer
    assert split["usage"]["prompt_tokens"] == expected["usage"]["prompt_tokens"]
    message = post(main_server, "/v1/messages", {**greedy, "messages": SPLIT, "max_tokens": 8})
    assert message["content"][0]["text"] == answer
    ollama = post(main_server, "/api/chat", {"model": MODEL, "messages": SPLIT, "stream": False,
                                             "options": {"temperature": 0, "num_predict": 8}})
    assert ollama["message"]["content"] == answer
    response = post(main_server, "/v1/responses", {**greedy, "input": SPLIT, "max_output_tokens": 8})
    assert response["output"][-1]["content"][0]["text"] == answer
    conversation = post(main_server, "/v1/conversations", {"items": [{"type": "message", **SPLIT[0]}]})
    asked = post(main_server, "/v1/responses", {**greedy, "conversation": conversation["id"],
                                                "input": SPLIT[1]["content"], "max_output_tokens": 8})
    assert asked["output"][-1]["content"][0]["text"] == answer
