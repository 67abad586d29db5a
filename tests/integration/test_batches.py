"""The Files and Batch APIs through the real server and the OpenAI SDK: a batch's answers are
the answers the same requests get one by one, a failed request's answer goes to the error file,
a file that cannot run is refused naming its lines, a batch leaves an interactive request a slot
(it yields to it), a cancelled batch keeps the results it has, and a batch a stopped server was
running goes on after the restart without running a finished request again."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from conftest import SMOLLM2, model_entry
from opshelp import small_tmpfs, wait_for

QUESTIONS = ["Name a colour.", "Name a fruit.", "Name an animal.", "Name a city."]
LONG = {"max_tokens": 300, "logit_bias": {"2": -100}}  # no end of text: it runs its 300 tokens


def config(tmp_path, **server) -> dict:
    return {"server": {"state_dir": str(tmp_path), **server},
            "models": [model_entry("smol", SMOLLM2, n_ctx=2048, n_parallel=2)]}


@pytest.fixture(scope="module")
def srv(server_factory, tmp_path_factory):
    return server_factory(config(tmp_path_factory.mktemp("batches")), "batches")


def sdk(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.base + "/v1", api_key="none", max_retries=0, timeout=120)


def jsonl(lines: list[dict]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def chat_line(custom_id: str, content: str, **extra) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": {
        "model": "smol", "messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 12,
        **extra}}


def submit(client: openai.OpenAI, lines: list[dict]):
    file = client.files.create(file=("requests.jsonl", jsonl(lines)), purpose="batch")
    return client.batches.create(input_file_id=file.id, endpoint="/v1/chat/completions", completion_window="24h")


def finished(client: openai.OpenAI, batch_id: str, timeout: float = 120):
    return wait_for(lambda: (b := client.batches.retrieve(batch_id)).status in ("completed", "failed", "cancelled",
                                                                                 "expired") and b, timeout=timeout)


def results(client: openai.OpenAI, file_id: str | None) -> dict[str, dict]:
    if file_id is None:
        return {}
    return {r["custom_id"]: r for r in map(json.loads, client.files.content(file_id).text.splitlines())}


def test_a_batch_answers_as_its_requests_one_by_one(srv):
    client = sdk(srv)
    lines = [chat_line(f"q{i}", q) for i, q in enumerate(QUESTIONS)]
    lines.append(chat_line("missing", "Hi") | {"body": {**chat_line("x", "Hi")["body"], "model": "nope"}})
    batch = submit(client, lines)
    assert batch.status == "in_progress" and batch.request_counts.total == 5
    done = finished(client, batch.id)
    assert done.status == "completed" and done.request_counts.completed == 4 and done.request_counts.failed == 1
    out, err = results(client, done.output_file_id), results(client, done.error_file_id)
    assert sorted(out) == ["q0", "q1", "q2", "q3"] and list(err) == ["missing"]
    for i, question in enumerate(QUESTIONS):
        alone = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": question}],
                                               temperature=0, max_tokens=12)
        answer = out[f"q{i}"]["response"]
        assert answer["status_code"] == 200 and answer["request_id"]
        assert answer["body"]["choices"][0]["message"]["content"] == alone.choices[0].message.content
    assert err["missing"]["response"]["status_code"] == 404
    assert err["missing"]["response"]["body"]["error"]["param"] == "model"
    listed = client.batches.list(limit=100).data
    assert listed[0].id == done.id  # newest first
    output = client.files.retrieve(done.output_file_id)
    assert output.purpose == "batch_output" and output.filename == f"{done.id}_output.jsonl"


def test_a_file_that_cannot_run_is_refused_naming_its_lines(srv):
    client = sdk(srv)
    good = chat_line("a", "Hi")
    batch = submit(client, [good, good, chat_line("b", "Hi") | {"url": "/v1/completions"},
                            chat_line("c", "Hi", stream=True)])
    assert batch.status == "failed"
    assert [(e.code, e.line) for e in batch.errors.data] == [
        ("duplicate_custom_id", 2), ("mismatched_endpoint", 3), ("invalid_request", 4)]
    file = client.files.create(file=("x.jsonl", jsonl([good])), purpose="batch")
    r = httpx.post(srv.base + "/v1/batches", json={"input_file_id": file.id, "endpoint": "/v1/models",
                                                   "completion_window": "24h"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "endpoint"
    r = httpx.post(srv.base + "/v1/batches", json={"input_file_id": "file-nothing", "endpoint": "/v1/completions",
                                                   "completion_window": "24h"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "input_file_id"


def test_the_files_api(srv):
    client = sdk(srv)
    made = client.files.create(file=("a.jsonl", b'{"x": 1}\n'), purpose="batch")
    assert made.bytes == 9 and made.filename == "a.jsonl" and made.purpose == "batch"
    assert client.files.retrieve(made.id).id == made.id
    assert client.files.content(made.id).content == b'{"x": 1}\n'
    assert made.id in [f.id for f in client.files.list(purpose="batch")]
    assert client.files.delete(made.id).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(made.id)
    r = httpx.post(srv.base + "/v1/files", files={"file": ("a.jsonl", b"{}\n")}, data={"purpose": "fine-tune"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "purpose", r.text
    r = httpx.post(srv.base + "/v1/files", data={"purpose": "batch"}, files={"other": ("a", b"x")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "file", r.text
    r = httpx.post(srv.base + "/v1/files", json={"purpose": "batch"})
    assert r.status_code == 415, r.text


def sched(srv) -> dict:
    return httpx.get(srv.base + "/v1/admin/scheduling/status").json()["models"]["smol"]


def test_a_batch_yields_a_slot_to_an_interactive_request_and_is_cancelled_with_what_it_has(srv):
    """Two slots and two batch requests at a time: one runs, one waits (a batch leaves the last
    slot free), and a chat request coming meanwhile runs at once beside it."""
    client = sdk(srv)
    batch = submit(client, [chat_line(f"long{i}", f"Tell story {i}.", **LONG) for i in range(6)])
    wait_for(lambda: sched(srv)["running"] == 1 and sched(srv)["queued"] == 1)
    assert "eie_batches_running 1.0" in httpx.get(srv.base + "/metrics").text
    assert sched(srv)["background"] == {"running": 1, "queued": 1, "parked": 0, "parked_bytes": 0}
    quick = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=4, temperature=0)
    assert quick.choices[0].message.content is not None
    # it ran beside the batch's first request (300 tokens), not after it
    assert client.batches.retrieve(batch.id).request_counts.completed == 0
    wait_for(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 1)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = finished(client, batch.id)
    assert done.status == "cancelled" and 1 <= done.request_counts.completed < 6
    out = results(client, done.output_file_id)
    assert len(out) == done.request_counts.completed and done.error_file_id is None
    wait_for(lambda: sched(srv)["running"] == 0 and sched(srv)["queued"] == 0, timeout=10)


def one_slot(tmp_path, **batches) -> dict:
    return {"server": {"state_dir": str(tmp_path), "batches": {"concurrent_requests": 1, **batches}},
            "models": [model_entry("smol", SMOLLM2, n_ctx=1024, n_parallel=1, max_queue=0)]}


def story(srv, **extra) -> str:
    r = httpx.post(srv.base + "/v1/chat/completions", timeout=120, json=chat_line("x", "Tell me a story.", **LONG)[
        "body"] | extra)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def test_an_interactive_request_parks_a_batch_request_that_then_resumes_where_it_stopped(server_factory, tmp_path):
    """One slot and no queue, the slot held by a batch's request: a chat request is not refused
    but takes the slot at once (the batch's sequence is parked: its KV state goes to host
    memory), and the batch's request then resumes from that state, its answer the very one the
    request gets alone."""
    srv = server_factory(one_slot(tmp_path), "batch-preempt")
    client = sdk(srv)
    batch = submit(client, [chat_line("long", "Tell me a story.", **LONG)])
    wait_for(lambda: sched(srv)["background"]["running"] == 1 and sched(srv)["decode_tokens"] >= 30)
    quick = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=4, temperature=0)
    assert quick.choices[0].message.content
    assert sched(srv)["background_preemptions"] == 1
    assert client.batches.retrieve(batch.id).request_counts.completed == 0  # it ran in the middle of the batch's
    assert "eie_background_preemptions_total{model=\"smol\"} 1.0" in httpx.get(srv.base + "/metrics").text
    done = finished(client, batch.id)
    answer = results(client, done.output_file_id)["long"]["response"]["body"]
    assert answer["usage"]["completion_tokens"] == 300
    assert answer["choices"][0]["message"]["content"] == story(srv)
    assert sched(srv)["background"] == {"running": 0, "queued": 0, "parked": 0, "parked_bytes": 0}
    srv.stop()  # (its threads would spin beside the next test's server)


def test_a_parked_request_follows_a_change_of_kv_types(server_factory, tmp_path):
    """A batch's request parked while a chat answer streams; the KV moves to q8_0 meanwhile: the
    parked state is converted with the live ones and the request resumes in the new types."""
    srv = server_factory(one_slot(tmp_path), "batch-preempt-kv")
    client = sdk(srv)
    batch = submit(client, [chat_line("long", "Tell me a story.", **LONG)])
    wait_for(lambda: sched(srv)["background"]["running"] == 1 and sched(srv)["decode_tokens"] >= 30)
    with httpx.stream("POST", srv.base + "/v1/chat/completions", timeout=120, json={
            "model": "smol", "messages": [{"role": "user", "content": "Tell me a joke."}], "stream": True,
            "temperature": 0, **LONG}) as r:
        lines = r.iter_lines()
        next(lines)
        parked = sched(srv)["background"]
        assert parked["parked"] == 1 and parked["parked_bytes"] > 0
        converted = httpx.post(srv.base + "/v1/admin/kv/convert", json={"model": "smol", "mode": "q8_0"},
                               timeout=120)
        assert converted.status_code == 200, converted.text
        assert converted.json()["sequences"] == 1  # the live one; the parked one follows it
        for _ in lines:
            pass
    done = finished(client, batch.id)
    assert done.request_counts.completed == 1, results(client, done.error_file_id)
    answer = results(client, done.output_file_id)["long"]["response"]["body"]
    assert answer["usage"]["completion_tokens"] == 300 and answer["choices"][0]["message"]["content"]
    srv.stop()


def test_without_preempt_an_interactive_request_waits_for_the_batch(server_factory, tmp_path):
    srv = server_factory(one_slot(tmp_path, preempt=False), "batch-no-preempt")
    client = sdk(srv)
    submit(client, [chat_line("long", "Tell me a story.", **LONG)])
    wait_for(lambda: sched(srv)["background"]["running"] == 1)
    refused = httpx.post(srv.base + "/v1/chat/completions", json=chat_line("x", "Hi")["body"])
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full"
    assert sched(srv)["background_preemptions"] == 0
    srv.stop()


def stopped_mid_batch(server_factory, tmp_path, name: str, requests: int) -> tuple[dict, str]:
    """A batch of long requests run one at a time, its server stopped once one has ended; the
    config and the batch's id."""
    cfg = config(tmp_path, batches={"concurrent_requests": 1})
    first = server_factory(cfg, name)
    client = sdk(first)
    batch = submit(client, [chat_line(f"long{i}", f"Tell story {i}.", **LONG) for i in range(requests)])
    wait_for(lambda: client.batches.retrieve(batch.id).request_counts.completed >= 1)
    first.stop()
    return cfg, batch.id


def test_a_batch_goes_on_after_a_restart_without_running_a_request_twice(server_factory, tmp_path):
    cfg, batch_id = stopped_mid_batch(server_factory, tmp_path, "batch-restart", 4)
    second = server_factory(cfg, "batch-resumed")
    client = sdk(second)
    done = finished(client, batch_id)
    assert done.status == "completed" and done.request_counts.completed == 4
    lines = client.files.content(done.output_file_id).text.splitlines()
    assert sorted(json.loads(line)["custom_id"] for line in lines) == [f"long{i}" for i in range(4)]


def test_a_request_refused_for_a_full_queue_goes_again(server_factory, tmp_path):
    """One slot and no queue: while a chat answer holds the slot the batch's request is refused
    (429 queue_full, retry-after) and goes again until it runs; its result is its answer."""
    cfg = {"server": {"state_dir": str(tmp_path)},
           "models": [model_entry("smol", SMOLLM2, n_ctx=1024, n_parallel=1, max_queue=0)]}
    srv = server_factory(cfg, "batch-queue-full")
    client = sdk(srv)
    with httpx.stream("POST", srv.base + "/v1/chat/completions", timeout=120, json={
            "model": "smol", "messages": [{"role": "user", "content": "Tell me a story."}], "stream": True,
            "temperature": 0, **LONG}) as r:
        lines = r.iter_lines()
        next(lines)
        refused = httpx.post(srv.base + "/v1/chat/completions", json=chat_line("x", "Hi")["body"])
        assert refused.status_code == 429 and refused.headers["retry-after"]  # what the batch meets
        batch = submit(client, [chat_line("only", "Name a colour.")])
        time.sleep(1)
        assert client.batches.retrieve(batch.id).request_counts.completed == 0
        for _ in lines:
            pass
    done = finished(client, batch.id)
    assert done.request_counts.completed == 1 and done.error_file_id is None
    assert results(client, done.output_file_id)["only"]["response"]["status_code"] == 200


def test_a_full_state_directory_is_a_507_and_a_batch_that_cannot_write_ends_failed(server_factory, tmp_path):
    # the server's own I/O errors were taken for a lost client: a raw text 500, 499 in the access
    # log; and a batch whose end could not be written stayed in_progress with nothing running it
    with small_tmpfs(tmp_path / "state", "2m") as mnt:
        srv = server_factory(config(mnt, batches={"concurrent_requests": 1}), "batch-disk-full")
        client = sdk(srv)
        batch = submit(client, [chat_line(f"long{i}", f"Tell story {i}.", **LONG) for i in range(2)])
        try:  # the rest of the file system
            with open(mnt / "filler", "wb") as f:
                while True:
                    f.write(b"\0" * 4096)
                    f.flush()
        except OSError:
            pass
        r = httpx.post(srv.base + "/v1/files", data={"purpose": "batch"}, timeout=60,
                       files={"file": ("more.jsonl", jsonl([chat_line("x", "Hi")]) * 400)})
        assert r.status_code == 507 and r.json()["error"]["code"] == "insufficient_storage", r.text
        done = finished(client, batch.id)
        assert done.status == "failed" and "could not write" in done.errors.data[0].message
        assert '"status": 507' in srv.log_path.read_text()
        srv.stop()


def test_a_file_an_unfinished_batch_reads_is_not_deleted_under_it(srv):
    # deleted, the batch went on with its open file, then failed at a restart with its finished
    # results stranded
    client = sdk(srv)
    batch = submit(client, [chat_line(f"long{i}", f"Tell story {i}.", **LONG) for i in range(2)])
    r = httpx.delete(f"{srv.base}/v1/files/{batch.input_file_id}", timeout=60)
    assert r.status_code == 409 and r.json()["error"]["code"] == "file_in_use" and batch.id in r.text, r.text
    client.batches.cancel(batch.id)
    assert finished(client, batch.id).status == "cancelled"
    assert client.files.delete(batch.input_file_id).deleted


def test_an_expired_batch_counts_the_requests_it_did_not_run_as_failed(server_factory, tmp_path):
    # they were in its error file but not in its counts: total != completed + failed
    cfg, batch_id = stopped_mid_batch(server_factory, tmp_path, "batch-expiring", 3)
    state = next(tmp_path.rglob(f"{batch_id}.json"))
    kept = json.loads(state.read_text())
    kept["batch"]["expires_at"] = int(time.time()) - 60  # its window passed while it was stopped
    state.write_text(json.dumps(kept))
    client = sdk(server_factory(cfg, "batch-expired"))
    done = finished(client, batch_id)
    counts = done.request_counts
    assert done.status == "expired" and counts.total == 3 and counts.completed >= 1
    assert counts.completed + counts.failed == 3
    errors = results(client, done.error_file_id)
    assert len(errors) == counts.failed and {e["error"]["code"] for e in errors.values()} == {"batch_expired"}


def test_a_file_of_exactly_the_cap_is_taken_and_one_byte_more_is_not(server_factory, tmp_path):
    # the cap was applied to the whole form, its boundaries and headers included
    srv = server_factory(config(tmp_path, files={"max_file_mb": 1}), "files-cap")
    line = json.dumps(chat_line("x", "Hi")).encode() + b"\n"
    exact = (line * ((1 << 20) // len(line) + 1))[: (1 << 20) - 1] + b"\n"
    assert len(exact) == 1 << 20
    ok = httpx.post(srv.base + "/v1/files", data={"purpose": "batch"}, files={"file": ("exact.jsonl", exact)}, timeout=60)
    assert ok.status_code == 200 and ok.json()["bytes"] == 1 << 20, ok.text
    over = httpx.post(srv.base + "/v1/files", data={"purpose": "batch"}, files={"file": ("over.jsonl", exact + b"\n")},
                      timeout=60)
    assert over.status_code == 413 and over.json()["error"]["param"] == "file", over.text
    srv.stop()
