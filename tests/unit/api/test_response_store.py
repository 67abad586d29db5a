"""The Responses API's store: caps by count and bytes (least recently used first), owners, and
conversations followed back through previous_response_id."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from appliance.api.response_store import MissingResponse, ResponseStore
from appliance.api.responses_schemas import Response
from appliance.api.schemas import ChatMessage


def response(rid: str, previous: str | None = None) -> Response:
    return Response(id=rid, created_at=0, status="completed", model="m", previous_response_id=previous)


def turns(text: str) -> list[ChatMessage]:
    return [ChatMessage("user", text), ChatMessage("assistant", text.upper())]


def test_a_conversation_is_every_turn_back_to_its_first_response():
    store = ResponseStore(10, 1 << 20)
    store.put(response("a"), [], turns("one"), None)
    store.put(response("b", "a"), [], turns("two"), None)
    store.put(response("c", "b"), [], turns("three"), None)
    assert [m.content for m in store.conversation("c", None)] == ["one", "ONE", "two", "TWO", "three", "THREE"]
    assert [m.content for m in store.conversation("b", None)] == ["one", "ONE", "two", "TWO"]


def test_a_missing_link_names_it():
    store = ResponseStore(10, 1 << 20)
    store.put(response("a"), [], turns("one"), None)
    store.put(response("b", "a"), [], turns("two"), None)
    store.delete("a", None)
    with pytest.raises(MissingResponse) as e:
        store.conversation("b", None)
    assert e.value.record_id == "b" and "'a'" in e.value.why
    with pytest.raises(MissingResponse):
        store.conversation("zzz", None)


def test_the_least_recently_used_go_first_by_count():
    store = ResponseStore(2, 1 << 20)
    store.put(response("a"), [], turns("one"), None)
    store.put(response("b"), [], turns("two"), None)
    store.get("a", None)  # used: b is now the oldest
    store.put(response("c"), [], turns("three"), None)
    with pytest.raises(MissingResponse):
        store.get("b", None)
    assert store.get("a", None) and store.get("c", None) and len(store) == 2 and store.dropped == 1


def test_the_byte_cap_holds_and_a_reload_resizes():
    store = ResponseStore(100, 1 << 20)
    for i in range(20):
        store.put(response(f"r{i}"), [{"type": "message", "text": "x" * 1000}], turns("t"), None)
    one = store.bytes // 20
    store.resize(100, one * 5 + one // 2)
    assert len(store) == 5 and store.bytes <= one * 5 + one // 2
    assert store.get("r19", None) and store.get("r15", None)
    with pytest.raises(MissingResponse):
        store.get("r14", None)
    store.resize(0, 1 << 20)
    assert len(store) == 0 and store.bytes == 0
    store.put(response("n"), [], turns("t"), None)  # max_entries 0: nothing is kept
    assert len(store) == 0


def test_one_larger_than_the_cap_is_not_kept_and_drops_nothing():
    store = ResponseStore(10, 2000)
    store.put(response("small"), [], turns("t"), None)
    store.put(response("big"), [{"text": "x" * 5000}], turns("t"), None)
    assert store.get("small", None) and len(store) == 1
    with pytest.raises(MissingResponse):
        store.get("big", None)


def test_another_key_cannot_read_delete_or_continue():
    store = ResponseStore(10, 1 << 20)
    store.put(response("mine"), [], turns("one"), "key-a")
    store.put(response("open"), [], turns("two"), None)
    for call in (lambda: store.get("mine", "key-b"), lambda: store.delete("mine", "key-b"),
                 lambda: store.conversation("mine", "key-b"), lambda: store.get("mine", None)):
        with pytest.raises(MissingResponse):
            call()
    assert store.get("mine", "key-a") and store.get("open", "key-b")


def test_a_restart_reads_the_stored_responses_back(tmp_path):
    store = ResponseStore(10, 1 << 20, tmp_path)
    store.put(response("a"), [{"type": "message", "id": "msg_1"}], turns("one"), "key-a")
    store.put(response("b", "a"), [], turns("two"), "key-a")
    store.put(response("gone"), [], turns("x"), None)
    store.delete("gone", None)
    store.close()
    assert sorted(f.name for f in tmp_path.iterdir()) == ["a.json", "b.json"]
    again = ResponseStore(10, 1 << 20, tmp_path)
    assert [m.content for m in again.conversation("b", "key-a")] == ["one", "ONE", "two", "TWO"]
    assert again.get("a", "key-a").input_items == [{"type": "message", "id": "msg_1"}]
    assert again.get("a", "key-a").response == response("a") and again.bytes == store.bytes
    with pytest.raises(MissingResponse):
        again.get("a", "key-b")


def test_the_use_order_and_the_caps_hold_across_a_restart(tmp_path):
    store = ResponseStore(3, 1 << 20, tmp_path)
    for name in "abc":
        store.put(response(name), [], turns(name), None)
    store.close()
    for i, name in enumerate("bca"):  # a used last
        os.utime(tmp_path / f"{name}.json", ns=(time.time_ns() + i * 10**9,) * 2)
    smaller = ResponseStore(2, 1 << 20, tmp_path)
    assert len(smaller) == 2 and smaller.dropped == 1
    with pytest.raises(MissingResponse):
        smaller.get("b", None)  # the least recently used
    smaller.put(response("d"), [], turns("d"), None)  # c is now the oldest
    smaller.close()
    assert sorted(f.name for f in tmp_path.iterdir()) == ["a.json", "d.json"]


def test_files_are_read_when_first_asked_for_and_an_unreadable_one_is_set_aside_then(tmp_path):
    store = ResponseStore(10, 1 << 20, tmp_path)
    store.put(response("a"), [], turns("one"), None)
    store.close()
    (tmp_path / "junk.json").write_text("{not json")
    (tmp_path / "other.json").write_bytes((tmp_path / "a.json").read_bytes())  # holds response a
    again = ResponseStore(10, 1 << 20, tmp_path)
    assert len(again) == 3 and again.bytes == sum(f.stat().st_size for f in tmp_path.iterdir())  # listed, not read
    for name in ("junk", "other"):
        with pytest.raises(MissingResponse):
            again.get(name, None)
    again.close()
    assert len(again) == 1 and again.bytes == (tmp_path / "a.json").stat().st_size
    # renamed, never deleted: what does not decode may still be someone's data
    assert sorted(f.name for f in tmp_path.iterdir()) == ["a.json", "junk.json.bad", "other.json.bad"]
    assert again.get("a", None).turns == turns("one")
    third = ResponseStore(10, 1 << 20, tmp_path)  # a record deleted before it was ever read
    third.delete("a", None)
    third.close()
    assert len(third) == 0 and third.bytes == 0 and not list(tmp_path.glob("*.json"))


TRANSIENT = """
import errno, resource, sys
from pathlib import Path
from appliance.api.json_store import StoreUnavailable
from appliance.api.response_store import ResponseStore
store = ResponseStore(10, 1 << 20, Path(sys.argv[1]))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
held = []
try:
    while True:
        held.append(open("/dev/null"))
except OSError as e:
    assert e.errno == errno.EMFILE
try:
    store.get("a", None)
    raise SystemExit("read with no file descriptor left")
except StoreUnavailable as e:
    assert e.status == 503 and e.code == "store_unavailable", e
for f in held:
    f.close()
print(store.get("a", None).response.id)
"""


def test_a_file_that_cannot_be_read_just_now_keeps_its_record(tmp_path):
    # (every OSError dropped the record and deleted its file: a burst of connections that took the
    # file descriptors, an SD card's read error, destroyed stored responses for good)
    store = ResponseStore(10, 1 << 20, tmp_path)
    store.put(response("a"), [], turns("one"), None)
    store.close()
    out = subprocess.run([sys.executable, "-c", TRANSIENT, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "a", out.stderr
    assert (tmp_path / "a.json").exists()


def test_an_unusable_directory_keeps_memory_only(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    memory_only = ResponseStore(10, 1 << 20, blocked / "responses")
    memory_only.put(response("a"), [], turns("t"), None)
    memory_only.close()
    assert memory_only.directory is None and memory_only.get("a", None)


def test_a_response_after_close_is_kept_in_memory_only(tmp_path):
    store = ResponseStore(10, 1 << 20, tmp_path)
    store.close()
    store.put(response("late"), [], turns("t"), None)
    assert store.get("late", None) and not list(tmp_path.iterdir())


def test_a_streamed_responses_events_are_stored_with_it_and_read_back_after_a_restart(tmp_path):
    events = [b'{"type":"response.created","sequence_number":0}', b'{"type":"response.completed","sequence_number":1}']
    store = ResponseStore(10, 1 << 20, tmp_path)
    store.put(response("a"), [], turns("one"), None, events)
    store.put(response("b"), [], turns("two"), None)
    store.close()
    again = ResponseStore(10, 1 << 20, tmp_path)
    assert again.get("a", None).events == events and again.get("b", None).events is None
    assert again.bytes == sum(f.stat().st_size for f in tmp_path.glob("*.json"))  # the events count
    assert (tmp_path / "a.json").stat().st_size > (tmp_path / "b.json").stat().st_size


def test_a_state_over_the_cap_is_kept_without_its_events_or_not_at_all_never_stale(tmp_path):
    # a background response's final state larger than server.responses.max_mb left its in_progress
    # state stored for good: not continuable, not cancellable
    from appliance.api.responses_routes import ResponsesRoutes

    store = ResponseStore(10, 20_000, tmp_path)
    routes = ResponsesRoutes(None, None, store)
    running = Response(id="r", created_at=0, status="in_progress", model="m")
    routes._store(running, [], turns("ask"), None, [b'{"type":"response.created"}'], 0)
    assert store.get("r", None).response.status == "in_progress"
    done = Response(id="r", created_at=0, status="completed", model="m")
    routes._store(done, [], turns("ask"), None, [b'{"type":"x","pad":"' + b"y" * 30_000 + b'"}'], 0)
    kept = store.get("r", None)
    assert kept.response.status == "completed" and kept.events is None
    routes._store(done, [], turns("ask" * 10_000), None, None, 0)  # even without events over the cap
    with pytest.raises(MissingResponse):
        store.get("r", None)
    store.close()
    assert not (tmp_path / "r.json").exists()
