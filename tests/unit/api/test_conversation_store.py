"""A stored conversation's file grows by appended turns (one line each) instead of being written
whole at every turn; it is written whole again once its turns outweigh the rest, so a long
conversation costs a few times its size in writes, not its size per turn. Read back after a
restart, with a last line a crash cut short left out."""

from __future__ import annotations

from pathlib import Path

from appliance.api.conversation_store import ConversationRecord, ConversationStore
from appliance.api.responses_schemas import Conversation


def message(i: int) -> dict:
    return {"id": f"msg_{i:04d}", "type": "message", "role": "user" if i % 2 else "assistant",
            "content": [{"type": "input_text", "text": f"turn {i}: " + "words " * 40}]}


def new_store(directory: Path, max_mb: int = 64) -> ConversationStore:
    return ConversationStore(1000, max_mb << 20, directory)


def test_turns_are_appended_and_read_back_after_a_restart(tmp_path):
    store = new_store(tmp_path)
    store.put(ConversationRecord(Conversation(id="conv_a", created_at=1, metadata={"k": "v"}), [message(0)], "key1"))
    written = []  # the bytes each turn wrote: what the file grew by, or its whole size when written whole
    size = 0
    for i in range(1, 201):
        store.extend("conv_a", "key1", [message(i)], cut=f"msg_{i // 50 * 50:04d}")
        store._disk.submit(lambda: None).result()  # its write done
        now = (tmp_path / "conv_a.json").stat().st_size
        written.append(now - size if now > size else now)
        size = now
    whole = sum(1 for w in written if w > 2000)  # a turn's line is about 330 bytes
    assert whole <= 10, written  # written whole when the turns outweigh the rest: about every doubling
    assert sum(written) < 4 * size  # against ~100 times its size when every turn wrote it whole
    lines = (tmp_path / "conv_a.json").read_bytes().split(b"\n")
    assert 1 < len(lines) < 201
    store.close()

    again = new_store(tmp_path)
    record = again.get("conv_a", "key1")
    assert [m["id"] for m in record.items] == [f"msg_{i:04d}" for i in range(201)]
    assert record.items == [message(i) for i in range(201)]
    assert record.cut == "msg_0200" and record.conversation.metadata == {"k": "v"} and record.owner == "key1"
    again.extend("conv_a", "key1", [message(201)])  # a turn without a cut keeps the last one
    assert again.get("conv_a", "key1").cut == "msg_0200"
    again.close()
    assert new_store(tmp_path).get("conv_a", "key1").items[-1] == message(201)


def test_a_turn_cut_short_by_a_crash_is_left_out(tmp_path):
    store = new_store(tmp_path)
    store.put(ConversationRecord(Conversation(id="conv_b", created_at=1, metadata={}),
                                 [message(i) for i in range(5)], None))
    for i in (5, 6):
        store.extend("conv_b", None, [message(i)])
    store.close()
    path = tmp_path / "conv_b.json"
    data = path.read_bytes()
    path.write_bytes(data[:-25])  # the last appended line half written
    record = new_store(tmp_path).get("conv_b", None)
    assert len(data.split(b"\n")) == 3  # appended, not written whole
    assert [m["id"] for m in record.items] == [f"msg_{i:04d}" for i in range(6)]


def test_turns_after_one_cut_short_are_kept_and_read_back(tmp_path):
    # the file keeps the torn line, and the next turn is appended after it: that middle line made
    # the whole file unreadable at the next start, and the conversation was dropped with its file
    store = new_store(tmp_path)
    store.put(ConversationRecord(Conversation(id="conv_t", created_at=1, metadata={}), [message(0)], None))
    store.extend("conv_t", None, [message(1)])
    store.close()
    path = tmp_path / "conv_t.json"
    path.write_bytes(path.read_bytes() + b'\n{"items":[{"type":"mess')  # a crash mid-append
    again = new_store(tmp_path)
    assert [m["id"] for m in again.get("conv_t", None).items] == ["msg_0000", "msg_0001"]
    again.extend("conv_t", None, [message(2)])
    again.close()
    third = new_store(tmp_path)
    assert [m["id"] for m in third.get("conv_t", None).items] == ["msg_0000", "msg_0001", "msg_0002"]
    third.close()


def test_a_turn_past_the_cap_is_not_kept(tmp_path):
    store = ConversationStore(10, 20_000, tmp_path)
    store.put(ConversationRecord(Conversation(id="conv_c", created_at=1, metadata={}), [message(0)], None))
    added = 0
    while store.add(store.get("conv_c", None), [message(added + 1)])[1]:
        added += 1
    assert 10 < added < 80 and store.bytes <= 20_000
    store.close()
    assert len(new_store(tmp_path).get("conv_c", None).items) == added + 1
