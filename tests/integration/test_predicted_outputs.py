"""OpenAI's predicted outputs (`prediction` on chat) through the real server: the predicted text is
a draft source of its own for speculative decoding (speculative/ngram.py PredictionLookup), so an
answer that follows it is verified in long runs, and the answer is the model's whatever the
prediction says (greedy: the same tokens as without one)."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import SMOLLM2, model_entry

STORY = [{"role": "user", "content": "Write a story about a lighthouse keeper."}]


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory({"models": [
        model_entry("spec", SMOLLM2, speculative={"sources": ["ngram"]}),
        model_entry("plain", SMOLLM2, n_parallel=1),
    ]}, "prediction")


def chat(server, model: str = "spec", **kw) -> dict:
    r = httpx.post(server.base + "/v1/chat/completions", timeout=300, json={
        "model": model, "messages": STORY, "max_tokens": 120, "temperature": 0, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def details(body: dict) -> dict:
    """completion_tokens_details, or zeros where none was given (nothing to report)."""
    return body["usage"].get("completion_tokens_details") or {
        "reasoning_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}


def predicted(server, model: str = "spec") -> int:
    status = httpx.get(server.base + "/v1/admin/scheduling/status", timeout=30).json()
    return status["models"][model]["speculative"]["prediction_accepted"]


def test_an_answer_that_follows_the_prediction_takes_its_drafts(server):
    plain = chat(server)
    answer = plain["choices"][0]["message"]["content"]
    before = predicted(server)
    got = chat(server, prediction={"type": "content", "content": answer})
    assert got["choices"][0]["message"]["content"] == answer
    counts = details(got)
    # how much is verified is the planner's and the controller's call on timed steps: on a quiet
    # machine most of the answer (bench/predicted_outputs.py measures it), on a busy one, where a
    # wide decode costs as much as its rows in plain steps, far less (27 of 120 beside a busy
    # core); so the test asks only that the prediction was taken, and nothing of it wrongly
    assert counts["accepted_prediction_tokens"] > 0
    assert counts["rejected_prediction_tokens"] <= 16  # at most the draft past the answer's end
    assert predicted(server) - before == counts["accepted_prediction_tokens"]


def test_an_edited_or_unrelated_prediction_changes_nothing_in_the_answer(server):
    answer = chat(server)["choices"][0]["message"]["content"]
    edited = answer.replace(" the ", " a ")
    for prediction in (edited, [{"type": "text", "text": edited[:200]}, {"type": "text", "text": edited[200:]}],
                       "Completely unrelated text about cooking pasta with tomatoes."):
        got = chat(server, prediction={"type": "content", "content": prediction})
        assert got["choices"][0]["message"]["content"] == answer
    assert details(got)["accepted_prediction_tokens"] < 10


def test_streamed_and_several_choices(server):
    answer = chat(server)["choices"][0]["message"]["content"]
    text, usage = "", None
    with httpx.stream("POST", server.base + "/v1/chat/completions", timeout=300, json={
            "model": "spec", "messages": STORY, "max_tokens": 120, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "prediction": {"type": "content", "content": answer}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                usage = chunk.get("usage") or usage
                text += "".join(c["delta"].get("content") or "" for c in chunk["choices"])
    assert text == answer and details({"usage": usage})["accepted_prediction_tokens"] > 0
    two = chat(server, n=2, prediction={"type": "content", "content": answer})
    assert [c["message"]["content"] for c in two["choices"]] == [answer, answer]
    assert details(two)["accepted_prediction_tokens"] > 0


def test_a_model_that_does_not_speculate_ignores_the_prediction(server):
    answer = chat(server, "plain")["choices"][0]["message"]["content"]
    got = chat(server, "plain", prediction={"type": "content", "content": answer})
    assert got["choices"][0]["message"]["content"] == answer
    # OpenAI's usage has the counts whenever a prediction was sent (they came and went)
    assert got["usage"]["completion_tokens_details"] == {
        "reasoning_tokens": 0, "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}
    assert "completion_tokens_details" not in chat(server, "plain")["usage"]


@pytest.mark.parametrize("prediction,param", [
    ({"type": "image", "content": "x"}, "prediction.type"),
    ({"type": "content", "content": [{"type": "image_url", "image_url": "x"}]}, "prediction.content[0].type"),
    ({"type": "content"}, "prediction.content"),
])
def test_a_bad_prediction_is_refused_by_name(server, prediction, param):
    r = httpx.post(server.base + "/v1/chat/completions", timeout=60, json={
        "model": "spec", "messages": STORY, "prediction": prediction})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
