"""The Batch API's state on disk: results read back after a restart (a line a stop cut short is
dropped, so its request runs again and the next result starts a line of its own), and an input
file's lines checked before a batch runs."""

from __future__ import annotations

import json
import tracemalloc

from appliance.api import batch_input
from appliance.api.batch_store import Batch, BatchStore


def test_results_after_a_restart_drop_a_line_cut_short(tmp_path):
    store = BatchStore(tmp_path)
    store.put(Batch(id="batch_1", endpoint="/v1/completions", input_file_id="f", completion_window="24h",
                    status="in_progress", created_at=0), None, 1)
    store.append("batch_1", False, {"custom_id": "a", "response": {"status_code": 200}})
    store.append("batch_1", True, {"custom_id": "b", "response": {"status_code": 400}})
    with open(store.results("batch_1", False), "ab") as f:
        f.write(b'{"custom_id": "c", "resp')  # the stop came mid-write
    again = BatchStore(tmp_path)
    assert again.get("batch_1", None).status == "in_progress"
    assert again.finished_ids("batch_1") == ({"a", "b"}, 1, 1)
    again.append("batch_1", False, {"custom_id": "c", "response": {"status_code": 200}})
    assert again.finished_ids("batch_1") == ({"a", "b", "c"}, 2, 1)


def test_openai_and_message_batches_are_read_back_after_a_restart(tmp_path):
    store = BatchStore(tmp_path)
    for stamp, batch_id in enumerate(("msgbatch_b", "batch_a")):
        store.put(Batch(id=batch_id, endpoint="/v1/messages", input_file_id="f", completion_window="24h",
                        status="completed", created_at=0), "key1", stamp)
    again = BatchStore(tmp_path)
    assert [b.id for b in again.listed("key1")] == ["msgbatch_b", "batch_a"] and again.listed("key2") == []


def test_an_input_files_lines_are_checked_each_naming_its_line(tmp_path):
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"model": "m", "prompt": "x"}}
    good = json.dumps(line).encode()
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join([good, b"", json.dumps(line | {"custom_id": "b"}).encode()]) + b"\r\n")
    assert batch_input.check(path, "/v1/completions") == (2, [])
    lines = list(batch_input.requests(path, "/v1/completions"))
    assert [x.custom_id for x in lines] == ["a", "b"] and [x.number for x in lines] == [1, 3]
    assert json.loads(lines[0].body) == line["body"]
    bad = [good, good, b"nope", json.dumps(line | {"custom_id": "c", "method": "GET"}).encode(),
           json.dumps(line | {"custom_id": "d", "body": {"stream": True}}).encode()]
    path.write_bytes(b"\n".join(bad))
    count, errors = batch_input.check(path, "/v1/completions")
    assert count == 1 and [(e.code, e.line, e.param) for e in errors] == [
        ("duplicate_custom_id", 2, "custom_id"), ("invalid_json_line", 3, None), ("invalid_method", 4, "method"),
        ("invalid_request", 5, "body.stream")]
    path.write_bytes(b"\n\n")
    assert batch_input.check(path, "/v1/completions")[1][0].code == "empty_file"


def test_a_large_input_file_is_read_a_line_at_a_time(tmp_path):
    """50,000 requests: counted without holding them, and the first read without reading the rest."""
    path = tmp_path / "in.jsonl"
    body = {"model": "m", "prompt": "x" * 600}
    with open(path, "w") as f:
        for i in range(batch_input.MAX_LINES):
            f.write(json.dumps({"custom_id": f"r{i}", "method": "POST", "url": "/v1/completions", "body": body}) + "\n")
    tracemalloc.start()
    try:
        assert batch_input.check(path, "/v1/completions") == (batch_input.MAX_LINES, [])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert path.stat().st_size > 30_000_000 and peak < 10_000_000  # the custom_ids seen, not the requests
    reading = batch_input.requests(path, "/v1/completions")
    assert next(reading).custom_id == "r0"
    reading.close()
    with open(path, "a") as f:
        f.write(json.dumps({"custom_id": "one-too-many", "method": "POST", "url": "/v1/completions",
                            "body": body}) + "\n")
    assert batch_input.check(path, "/v1/completions")[1][0].code == "too_many_requests"
