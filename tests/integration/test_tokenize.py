"""POST /tokenize and /detokenize on the real models: counts agree with what the generation
endpoints report as prompt_tokens, text round-trips, special tokens and bad input."""

from __future__ import annotations

import httpx
import pytest

MODELS = ["smollm2-135m", "gemma3-270m"]
TEXT = "Tokenizers split text: naïve café, 12345 and 🚀 too."


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base + path, json=body, timeout=120)


def ok(server, path: str, body: dict) -> dict:
    r = post(server, path, body)
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("model", MODELS)
def test_counts_are_the_prompt_tokens_of_the_same_completion_and_chat(main_server, model):
    text = ok(main_server, "/tokenize", {"model": model, "content": TEXT})
    done = ok(main_server, "/v1/completions", {"model": model, "prompt": TEXT, "max_tokens": 1})
    assert text["count"] == len(text["tokens"]) == done["usage"]["prompt_tokens"]
    assert text["max_context"] == 2048
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": TEXT}]
    chat = ok(main_server, "/tokenize", {"model": model, "messages": messages})
    done = ok(main_server, "/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": 1})
    assert chat["count"] == done["usage"]["prompt_tokens"] > text["count"]
    # the completion of the token ids is the completion of the text
    by_ids = ok(main_server, "/v1/completions", {"model": model, "prompt": text["tokens"], "max_tokens": 8,
                                                 "temperature": 0})
    by_text = ok(main_server, "/v1/completions", {"model": model, "prompt": TEXT, "max_tokens": 8, "temperature": 0})
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"]


@pytest.mark.parametrize("model", MODELS)
def test_text_round_trips_and_pieces_spell_it(main_server, model):
    plain = ok(main_server, "/tokenize", {"model": model, "content": TEXT, "add_special": False})
    back = ok(main_server, "/detokenize", {"model": model, "tokens": plain["tokens"]})
    assert back["content"] == TEXT
    pieces = ok(main_server, "/tokenize", {"model": model, "content": TEXT, "add_special": False,
                                           "with_pieces": True})["tokens"]
    assert [p["id"] for p in pieces] == plain["tokens"]
    # a piece that is part of a character (the rocket's 4 bytes) comes as its byte values, as
    # llama-server gives it: the pieces' bytes spell the text
    spelt = b"".join(p["piece"].encode() if isinstance(p["piece"], str) else bytes(p["piece"]) for p in pieces)
    assert spelt == TEXT.encode()
    for p in pieces:
        if not isinstance(p["piece"], str):
            with pytest.raises(UnicodeDecodeError):
                bytes(p["piece"]).decode("utf-8")


def test_special_tokens_are_parsed_only_when_asked(main_server):
    body = {"model": "smollm2-135m", "content": "<|im_end|>", "add_special": False}
    literal = ok(main_server, "/tokenize", body)["tokens"]
    parsed = ok(main_server, "/tokenize", {**body, "parse_special": True})["tokens"]
    assert len(parsed) == 1 and len(literal) > 1
    assert ok(main_server, "/detokenize", {"model": "smollm2-135m", "tokens": parsed})["content"] == "<|im_end|>"


@pytest.mark.parametrize("path, body, status, param", [
    ("/tokenize", {"model": "smollm2-135m"}, 400, "content"),
    ("/tokenize", {"model": "smollm2-135m", "content": "a", "messages": [{"role": "user", "content": "b"}]}, 400,
     "content"),
    ("/tokenize", {"model": "smollm2-135m", "content": 5}, 400, "content"),
    ("/tokenize", {"model": "nope", "content": "a"}, 404, "model"),
    ("/detokenize", {"model": "smollm2-135m", "tokens": [1, 49152]}, 400, "tokens[1]"),
    ("/detokenize", {"model": "gemma3-270m", "tokens": ["a"]}, 400, "tokens[0]"),
])
def test_bad_requests_name_the_field(main_server, path, body, status, param):
    r = post(main_server, path, body)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param
