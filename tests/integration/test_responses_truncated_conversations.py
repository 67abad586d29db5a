"""truncation: auto through the real server: a conversation longer than the context goes on
without its oldest turns (refused without it), the cut stays put while the turns after it fit
(their prompts start alike, and the prefix cache restores them; /v1/responses/input_tokens
counts each prompt as it is cut), and what cannot be cut (the
latest turn alone too long, a group) is refused naming the field."""

from __future__ import annotations

import httpx
import pytest

from conftest import SMOLLM2, model_entry

GPL = open("/usr/share/common-licenses/GPL-3").read()
N_CTX = 512


@pytest.fixture(scope="module")
def srv(server_factory):
    return server_factory({"models": [model_entry("smol", SMOLLM2, n_ctx=N_CTX, n_parallel=1)],
                           "groups": [{"name": "chain", "type": "sequential", "models": ["smol", "smol"]}]},
                          "responses-truncation")


def ask(srv, after: dict, turn: int, path: str = "/v1/responses", **body) -> httpx.Response:
    return httpx.post(srv.base + path, timeout=120, json={
        "model": "smol", "temperature": 0, "max_output_tokens": 8, "instructions": "Answer in one word.",
        "input": f"Note {turn}: {GPL[turn * 400:(turn + 1) * 400]}", **after, **body})


@pytest.mark.parametrize("kept_in", ["previous_response_id", "conversation"])
def test_a_long_conversation_goes_on_without_its_oldest_turns(srv, kept_in):
    """Turns chained by previous_response_id, or made in a conversation object (whose cut is
    the item it fell at)."""
    if kept_in == "conversation":
        after = {"conversation": httpx.post(srv.base + "/v1/conversations", json={}).json()["id"]}
    else:
        after = {}
    prompts, cached = [], []
    for turn in range(9):
        counted = ask(srv, after, turn, "/v1/responses/input_tokens", truncation="auto")
        r = ask(srv, after, turn, truncation="auto")
        assert r.status_code == 200, r.text
        response = r.json()
        assert counted.json()["input_tokens"] == response["usage"]["input_tokens"]  # the cut counted as made
        assert response["truncation"] == "auto" and response["status"] in ("completed", "incomplete")
        if len(prompts) >= 4 and prompts[-1] > 300:
            refused = ask(srv, after, turn)  # the same turn without truncation: over the context
            assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
        if kept_in == "previous_response_id":
            after = {"previous_response_id": response["id"]}
        prompts.append(response["usage"]["input_tokens"])
        cached.append(response["usage"]["input_tokens_details"]["cached_tokens"])
    assert max(prompts) <= N_CTX - 8 and sum(map(int, prompts)) > 2 * N_CTX  # it went on past the context
    cuts = [i for i in range(1, len(prompts)) if prompts[i] < prompts[i - 1]]
    assert cuts and all(prompts[i] <= 0.75 * (N_CTX - 8) for i in cuts), prompts  # room left to grow
    stayed = [i for i in range(cuts[0] + 1, len(prompts)) if i not in cuts]
    assert stayed, prompts  # a turn after a cut that kept it...
    for i in stayed:  # ...read the turns before it from the prefix cache
        assert cached[i] >= prompts[i - 1] - 64, (prompts, cached)


def test_what_cannot_be_cut_is_refused_naming_the_field(srv):
    r = httpx.post(srv.base + "/v1/responses", timeout=120, json={
        "model": "smol", "input": GPL[:6000], "truncation": "auto"})  # the latest turn alone is too long
    assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text
    r = httpx.post(srv.base + "/v1/responses", timeout=120, json={
        "model": "chain", "input": "Hi", "truncation": "auto"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncation", r.text
    r = httpx.post(srv.base + "/v1/responses", timeout=120, json={"model": "smol", "input": "Hi", "truncation": "some"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncation", r.text
