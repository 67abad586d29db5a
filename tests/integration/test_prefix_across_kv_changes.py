"""The prefix cache across live KV type changes, through the real server: a restored prefix must
compute what a cold prefill with the context's current types computes. Neither a state saved
under other types nor a sequence that lived through a migration may answer for them (found by
bench/soak.py: after converting to q8_0 and back under load, greedy answers had changed for good)."""

from __future__ import annotations

import json
import threading
import uuid

import httpx
import pytest

from conftest import SMOLLM2, model_entry

STORY = "Write a long story about a lighthouse keeper and the storm that came one winter."


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory({"models": [model_entry("m", SMOLLM2, n_ctx=2048)]}, "prefix-kv-changes")


def convert(server, mode: str) -> dict:
    r = httpx.post(server.base + "/v1/admin/kv/convert", json={"model": "m", "mode": mode}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def flush(server) -> None:
    assert httpx.post(server.base + "/v1/admin/kv/flush", json={"model": "m"}, timeout=60).status_code == 200


def scored(server, messages: list[dict]) -> tuple[str, list[float], int]:
    """The greedy answer, its tokens' logprobs and the prompt tokens restored from the cache."""
    r = httpx.post(server.base + "/v1/chat/completions", timeout=120, json={
        "model": "m", "messages": messages, "max_tokens": 16, "temperature": 0, "logprobs": True})
    assert r.status_code == 200, r.text
    body = r.json()
    choice = body["choices"][0]
    return (choice["message"]["content"], [t["logprob"] for t in choice["logprobs"]["content"]],
            body["usage"]["prompt_tokens_details"]["cached_tokens"])


def test_a_prefix_saved_under_other_kv_types_is_not_restored(server):
    messages = [{"role": "user", "content": f"Note {uuid.uuid4().hex}. Describe the sea at night in detail."}]
    cold = scored(server, messages)
    flush(server)
    convert(server, "q8_0")
    scored(server, messages)  # saves the prefix computed with q8_0 keys and values
    convert(server, "f16")
    again = scored(server, messages)
    assert again[2] == 0  # a miss: the q8_0 state does not answer for f16
    assert again[:2] == cold[:2]  # the same tokens with the same logprobs, to the last bit
    convert(server, "q8_0")
    under_q8 = scored(server, messages)
    assert under_q8[2] > 0  # the q8_0 state is there for q8_0 again
    convert(server, "f16")


def test_a_sequence_that_lived_through_a_migration_saves_nothing(server):
    flush(server)
    story = [{"role": "user", "content": f"({uuid.uuid4().hex}) {STORY}"}]
    chunks: list[str] = []
    started = threading.Event()

    def stream() -> None:
        body = {"model": "m", "messages": story, "max_tokens": 160, "temperature": 0, "stream": True,
                "logit_bias": {"2": -100}}  # SmolLM2's <|im_end|>: the story runs its full length
        with httpx.stream("POST", server.base + "/v1/chat/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    delta = json.loads(line[6:])["choices"][0]["delta"].get("content")
                    chunks.append(delta or "")
                    started.set()

    t = threading.Thread(target=stream)
    t.start()
    assert started.wait(60)
    assert convert(server, "q8_0")["sequences"] == 1
    assert convert(server, "f16")["sequences"] == 1
    t.join(120)
    assert not t.is_alive() and len(chunks) > 40
    # the conversation's next turn: before, the story's whole context was saved at its end, and
    # restored here with keys and values that had been through q8_0
    turn = [*story, {"role": "assistant", "content": "".join(chunks)}, {"role": "user", "content": "Go on."}]
    restored = scored(server, turn)
    # the reference: the story's prompt prefix alone saved, with no migration, then the same turn
    flush(server)
    r = httpx.post(server.base + "/v1/admin/kv/warm", json={"model": "m", "messages": story}, timeout=120)
    assert r.status_code == 200, r.text
    reference = scored(server, turn)
    # only the prompt's own prefix (saved at its prefill, before the migration) was restored,
    # not the story's whole context, and what followed is what a run without migration computes
    assert 0 < restored[2] == reference[2] < 100
    assert restored[:2] == reference[:2]
