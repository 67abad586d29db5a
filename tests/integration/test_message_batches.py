"""Anthropic's Message Batches API through the real server and the anthropic SDK: each result is
the message the same request gets alone, a request that fails is errored with Anthropic's error,
a cancelled batch's requests not run are canceled, an ended batch is deleted, and bad batches are
refused naming the request."""

from __future__ import annotations

import anthropic
import httpx
import pytest

from conftest import SMOLLM2, model_entry
from opshelp import wait_for

QUESTIONS = ["Name a colour.", "Name a fruit.", "Name an animal."]


@pytest.fixture(scope="module")
def srv(server_factory, tmp_path_factory):
    return server_factory({"server": {"state_dir": str(tmp_path_factory.mktemp("msgbatches"))},
                           "models": [model_entry("smol", SMOLLM2, n_ctx=2048, n_parallel=2)]}, "message-batches")


@pytest.fixture(scope="module")
def client(srv):
    return anthropic.Anthropic(base_url=srv.base, api_key="none", max_retries=0, timeout=120)


def params(question: str, **extra) -> dict:
    return {"model": "smol", "max_tokens": 12, "temperature": 0,
            "messages": [{"role": "user", "content": question}], **extra}


def ended(client, batch_id: str):
    return wait_for(lambda: (b := client.messages.batches.retrieve(batch_id)).processing_status == "ended" and b,
                    timeout=120)


def test_a_message_batch_answers_as_its_requests_one_by_one(client):
    requests = [{"custom_id": f"q{i}", "params": params(q)} for i, q in enumerate(QUESTIONS)]
    requests.append({"custom_id": "nope", "params": params("Hi", model="nope")})
    batch = client.messages.batches.create(requests=requests)
    assert batch.processing_status == "in_progress" and batch.request_counts.processing == 4
    done = ended(client, batch.id)
    assert done.request_counts.succeeded == 3 and done.request_counts.errored == 1 and done.results_url
    results = {r.custom_id: r.result for r in client.messages.batches.results(batch.id)}
    assert sorted(results) == ["nope", "q0", "q1", "q2"]
    for i, question in enumerate(QUESTIONS):
        alone = client.messages.create(**{k: v for k, v in params(question).items() if k != "temperature"},
                                       extra_body={"temperature": 0})
        assert results[f"q{i}"].type == "succeeded"
        assert results[f"q{i}"].message.content[0].text == alone.content[0].text
    assert results["nope"].type == "errored" and results["nope"].error.error.type == "not_found_error"
    assert batch.id in [b.id for b in client.messages.batches.list(limit=100)]
    assert client.messages.batches.delete(batch.id).id == batch.id
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(batch.id)


def test_a_cancelled_message_batch_keeps_what_ran(client):
    long = {"max_tokens": 300, "logit_bias": {"2": -100}}
    batch = client.messages.batches.create(requests=[{"custom_id": f"s{i}", "params": params(f"Story {i}.", **long)}
                                                     for i in range(6)])
    wait_for(lambda: client.messages.batches.retrieve(batch.id).request_counts.succeeded >= 1)
    cancelling = client.messages.batches.cancel(batch.id)
    assert cancelling.processing_status in ("canceling", "ended") and cancelling.cancel_initiated_at
    done = ended(client, batch.id)
    counts = done.request_counts
    assert counts.succeeded >= 1 and counts.canceled >= 1 and counts.succeeded + counts.canceled == 6
    kinds = [r.result.type for r in client.messages.batches.results(batch.id)]
    assert sorted(kinds) == sorted(["succeeded"] * counts.succeeded + ["canceled"] * counts.canceled)


@pytest.mark.parametrize("body,param", [
    ({"requests": []}, "requests"),
    ({"requests": [{"custom_id": "a b", "params": params("Hi")}]}, "requests[0].custom_id"),
    ({"requests": [{"custom_id": "a", "params": params("Hi")}, {"custom_id": "a", "params": params("Hi")}]},
     "requests[1].custom_id"),
    ({"requests": [{"custom_id": "a", "params": params("Hi", stream=True)}]}, "requests[0].params.stream"),
])
def test_bad_batches_are_refused_naming_the_request(srv, body, param):
    r = httpx.post(srv.base + "/v1/messages/batches", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["param"] == param, r.text


def test_message_batches_and_openai_batches_stay_apart(srv, client):
    batch = client.messages.batches.create(requests=[{"custom_id": "a", "params": params("Hi")}])
    assert httpx.get(f"{srv.base}/v1/batches/{batch.id}").status_code == 404
    assert batch.id not in [b["id"] for b in httpx.get(srv.base + "/v1/batches").json()["data"]]
    ended(client, batch.id)


def test_the_list_pages_both_ways_and_says_where_more_lie(srv, client):
    made = [client.messages.batches.create(requests=[{"custom_id": "a", "params": params("Hi", model="nope")}]).id
            for _ in range(4)]
    for batch_id in made:
        ended(client, batch_id)
    newest_first = [b["id"] for b in httpx.get(srv.base + "/v1/messages/batches", params={"limit": 1000}).json()["data"]]
    assert newest_first[:4] == made[::-1]
    page = httpx.get(srv.base + "/v1/messages/batches", params={"limit": 2, "before_id": made[0]}).json()
    # the two made just after the oldest of these, and more beyond them that way (has_more was
    # always false with before_id)
    assert [b["id"] for b in page["data"]] == [made[2], made[1]] and page["has_more"] is True
    assert page["first_id"] == made[2] and page["last_id"] == made[1]
    page = httpx.get(srv.base + "/v1/messages/batches", params={"limit": 3, "before_id": made[0]}).json()
    assert [b["id"] for b in page["data"]] == made[3:0:-1] and page["has_more"] is False
    page = httpx.get(srv.base + "/v1/messages/batches", params={"limit": 2, "after_id": made[3]}).json()
    assert [b["id"] for b in page["data"]] == [made[2], made[1]] and page["has_more"] is True
    r = httpx.get(srv.base + "/v1/messages/batches", params={"before_id": "msgbatch_none"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "before_id"
    r = httpx.get(srv.base + "/v1/messages/batches", params={"before_id": made[0], "after_id": made[3]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "before_id"


def test_a_message_batchs_files_are_deleted_with_it_not_through_the_files_api(srv, client):
    # deleting its results file turned its succeeded requests into canceled ones
    batch = client.messages.batches.create(requests=[{"custom_id": "a", "params": params("Hi")}])
    ended(client, batch.id)
    mine = [f for f in httpx.get(srv.base + "/v1/files", timeout=60).json()["data"]
            if f["filename"].startswith(batch.id)]
    assert mine
    for f in mine:
        r = httpx.delete(f"{srv.base}/v1/files/{f['id']}", timeout=60)
        assert r.status_code == 409 and r.json()["error"]["code"] == "file_in_use", r.text
    assert [r.result.type for r in client.messages.batches.results(batch.id)] == ["succeeded"]
    client.messages.batches.delete(batch.id)
