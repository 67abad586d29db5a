"""The prefix store on its own (no model): chained keys, tiers, restart, corruption, disk faults,
concurrency. States are opaque bytes here; tests/integration/test_prefix_cache.py runs it with
real llama.cpp states."""

from __future__ import annotations

import os
import struct
import threading
from pathlib import Path

import pytest

from appliance.kv.prefix_store import MAGIC, PrefixStore, block_keys

ID = b"\x01" * 16
OTHER_ID = b"\x02" * 16
MB = 1 << 20


def store(tmp: Path | None, identity: bytes = ID, ram: int = 8 * MB, disk: int = 64 * MB, **kw) -> PrefixStore:
    return PrefixStore(identity, block=4, ram_bytes=ram, disk_dir=tmp, disk_bytes=disk, **kw)


def test_keys_are_chained_and_scoped_by_identity():
    a = block_keys(ID, list(range(12)), 4)
    assert len(a) == 3 and len(set(a)) == 3
    assert block_keys(ID, list(range(8)) + [99, 9, 10, 11], 4)[:2] == a[:2]  # shared prefix, shared keys
    assert block_keys(ID, list(range(8)) + [99, 9, 10, 11], 4)[2] != a[2]
    assert block_keys(OTHER_ID, list(range(12)), 4)[0] != a[0]
    assert block_keys(ID, [5, 0, 1, 2], 4)[0] != block_keys(ID, [0, 1, 2, 5], 4)[0]
    assert block_keys(ID, list(range(7)), 4) == a[:1]  # partial blocks have no key


def test_longest_prefix_wins_and_shorter_matches_reuse_a_longer_entry(tmp_path):
    s = store(tmp_path)
    keys = block_keys(ID, list(range(16)), 4)
    s.put(keys[:2], b"two blocks")
    s.put(keys, b"four blocks")
    hit = s.lookup(keys)
    assert (hit.n_blocks, hit.state, hit.tier) == (4, b"four blocks", "ram")
    other = block_keys(ID, list(range(12)) + [7, 7, 7, 7], 4)
    hit = s.lookup(other)  # diverges in block 4: the 4-block entry answers for 3 blocks
    assert (hit.n_blocks, hit.state) == (3, b"four blocks")
    assert s.lookup(block_keys(ID, [9] * 8, 4)) is None
    assert s.status()["misses"] == 1 and s.status()["ram"]["hits"] == 2
    s.close()


def test_an_entry_that_ends_where_the_match_ends_answers_before_a_longer_one(tmp_path):
    # (a longer entry would have to be cut back: with a window-sized sliding-window cache that can
    # be refused, engine/prefix.py)
    s = store(tmp_path)
    keys = block_keys(ID, list(range(16)), 4)
    s.put(keys[:3], b"three blocks")
    s.put(keys, b"four blocks")  # now indexed for the first three blocks too
    other = block_keys(ID, list(range(12)) + [7, 7, 7, 7], 4)
    assert (s.lookup(other).n_blocks, s.lookup(other).state) == (3, b"three blocks")
    assert s.lookup(keys[:2]).state == b"four blocks"  # no entry ends at block 2: the longer one
    s.close()


def test_a_second_store_restores_what_the_first_wrote(tmp_path):
    keys = block_keys(ID, list(range(8)), 4)
    first = store(tmp_path)
    first.put(keys, b"state" * 1000)
    first.drain(10)
    first.close()
    files = list((tmp_path / ID.hex()).glob("*.kv"))
    assert len(files) == 1
    second = store(tmp_path)
    assert second.status()["disk"]["entries"] == 1 and second.status()["ram"]["entries"] == 0
    hit = second.lookup(keys)
    assert (hit.tier, hit.state, hit.n_blocks) == ("disk", b"state" * 1000, 2)
    assert second.lookup(keys).tier == "ram"  # promoted
    second.close()


def _written(tmp_path, payload=b"payload" * 100):
    keys = block_keys(ID, list(range(8)), 4)
    s = store(tmp_path)
    s.put(keys, payload)
    s.drain(10)
    s.close()
    return keys, next((tmp_path / ID.hex()).glob("*.kv"))


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty"])
def test_damaged_entries_are_deleted_and_missed(tmp_path, damage):
    keys, path = _written(tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-10] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) - 50]
    elif damage == "garbage":
        data = bytearray(os.urandom(len(data)))
    else:
        data = bytearray()
    path.write_bytes(bytes(data))
    s = store(tmp_path)
    assert s.lookup(keys) is None
    assert not path.exists()
    assert s.status()["counters"]["corrupt_deleted"] == 1
    s.close()


@pytest.mark.parametrize("header", [b"[1, 2]", b"{}", b'{"identity": "ID"}', b'{"identity": "ID", "key": 5}',
                                    b'{"identity": "ID", "key": "KEY", "keys": "KEY"}', b'{"identity": "ID", "key": "zz"}'])
def test_an_entry_whose_header_has_another_shape_is_deleted_and_the_store_works(tmp_path, header):
    # (such a header once raised past the scan, and the model served with no prefix cache at all)
    keys, path = _written(tmp_path)
    header = header.replace(b"ID", ID.hex().encode()).replace(b"KEY", keys[-1].hex().encode())
    bad = path.with_name("11" * 16 + ".kv")
    bad.write_bytes(MAGIC + struct.pack("<I", len(header)) + header)
    s = store(tmp_path)
    assert not bad.exists() and s.status()["counters"]["corrupt_deleted"] == 1
    assert s.lookup(keys).state == b"payload" * 100  # the good entry beside it still restores
    s.close()


def test_entries_of_another_model_identity_are_never_restored(tmp_path):
    keys, path = _written(tmp_path)
    # the same file placed where another identity looks for its entries
    foreign_dir = tmp_path / OTHER_ID.hex()
    foreign_dir.mkdir()
    moved = foreign_dir / path.name
    path.rename(moved)
    s = store(tmp_path, identity=OTHER_ID)
    assert s.lookup(block_keys(OTHER_ID, list(range(8)), 4)) is None
    assert not moved.exists()  # foreign: deleted at the scan
    s.close()


def test_a_renamed_entry_is_rejected(tmp_path):
    keys, path = _written(tmp_path)
    path.rename(path.with_name("00" * 16 + ".kv"))
    s = store(tmp_path)
    assert s.status()["disk"]["entries"] == 0 and s.status()["counters"]["corrupt_deleted"] == 1
    s.close()


def test_read_only_directory_turns_the_disk_tier_off_and_requests_go_on(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions; the tmpfs-full test covers write errors")
    d = tmp_path / ID.hex()
    d.mkdir()
    d.chmod(0o500)
    try:
        s = store(tmp_path)
        keys = block_keys(ID, list(range(8)), 4)
        s.put(keys, b"x" * 100)
        s.drain(10)
        assert s.status()["disk"]["enabled"] is False and "permission" in s.status()["disk"]["error"]
        assert s.lookup(keys).tier == "ram"
        s.close()
    finally:
        d.chmod(0o700)


def test_disk_full_turns_the_disk_tier_off(tmp_path):
    """A write that fails with ENOSPC (produced for real: /dev/full refuses every write)."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    # the writer thread's next temp file is a symlink to /dev/full
    s2 = store(tmp_path / "full")
    keys2 = block_keys(ID, list(range(4, 12)), 4)
    writer_tmp = s2.dir / f"{keys2[-1].hex()}.{s2._writer.ident}.tmp"
    writer_tmp.symlink_to("/dev/full")
    s2.put(keys2, b"z" * 100_000)
    s2.drain(10)
    status = s2.status()["disk"]
    assert status["enabled"] is False and status["error"].startswith("disk full"), status
    assert s2.lookup(keys2).tier == "ram"  # still served from RAM
    s2.put(block_keys(ID, [1, 2, 3, 4], 4), b"more")  # later saves skip the disk quietly
    s2.close()


def test_caps_evict_least_recently_used(tmp_path):
    s = store(tmp_path, ram=3000, disk=5000)
    entries = [block_keys(ID, [i] * 4, 4) for i in range(6)]
    for keys in entries:
        s.put(keys, bytes(1000))
    s.drain(10)
    st = s.status()
    assert st["ram"]["bytes"] <= 3000 and st["disk"]["bytes"] <= 5000
    assert s.lookup(entries[0]) is None  # oldest: gone from both tiers
    assert s.lookup(entries[-1]) is not None
    s.close()


def test_shrink_ram_keeps_entries_reachable_on_disk(tmp_path):
    s = store(tmp_path)
    keys = block_keys(ID, list(range(8)), 4)
    s.put(keys, b"spill me" * 100)
    s.drain(10)
    assert s.shrink_ram(0) == 800
    assert s.status()["ram"]["entries"] == 0
    assert s.lookup(keys).tier == "disk"
    s.close()


def test_concurrent_writers_and_readers(tmp_path):
    s = store(tmp_path, ram=200_000)
    errors: list[BaseException] = []

    def worker(w: int) -> None:
        try:
            for i in range(40):
                keys = block_keys(ID, [w, i, 0, 0, w, i, 1, 1], 4)
                s.put(keys, bytes([w, i]) * 500)
                hit = s.lookup(keys)
                assert hit is not None and hit.state == bytes([w, i]) * 500
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s.drain(30)
    assert not errors
    s.close()
    again = store(tmp_path)
    assert again.status()["disk"]["entries"] == 240
    for w in range(6):
        assert again.lookup(block_keys(ID, [w, 39, 0, 0, w, 39, 1, 1], 4)).state == bytes([w, 39]) * 500
    again.close()


def test_close_writes_what_is_queued_and_lets_go_of_the_ram_tier(tmp_path):
    # an unloaded model's store may still be referenced (a metrics scrape keeps the last runner):
    # it must not keep its states resident
    keys = block_keys(ID, list(range(8)), 4)
    for disk in (tmp_path, None):
        s = store(disk)
        s.put(keys, b"d" * 1000)
        assert s.status()["ram"]["entries"] == 1
        s.close()
        assert s.ram_used == 0 and s.status()["ram"]["entries"] == 0
        hit = s.lookup(keys)
        assert (hit.tier == "disk") if disk else (hit is None)


def test_flush_forgets_everything(tmp_path):
    s = store(tmp_path)
    keys = block_keys(ID, list(range(8)), 4)
    s.put(keys, b"x" * 10)
    s.drain(10)
    s.flush()
    assert s.lookup(keys) is None and not list((tmp_path / ID.hex()).glob("*.kv"))
    s.close()


def test_disk_writes_wait_until_the_box_is_quiet(tmp_path):
    quiet = threading.Event()
    s = store(tmp_path, wait_quiet=lambda max_s: quiet.wait(max_s))
    keys = block_keys(ID, list(range(8)), 4)
    s.put(keys, b"state" * 100)
    assert s.lookup(keys).tier == "ram"  # served from RAM meanwhile
    s.drain(0.3)
    assert not list((tmp_path / ID.hex()).glob("*.kv"))  # still busy: nothing written
    quiet.set()
    s.drain(10)
    assert len(list((tmp_path / ID.hex()).glob("*.kv"))) == 1
    s.close()


def test_flush_drops_writes_still_waiting_for_a_quiet_box(tmp_path):
    quiet = threading.Event()
    s = store(tmp_path, wait_quiet=lambda max_s: quiet.wait(max_s))
    first, second = block_keys(ID, list(range(8)), 4), block_keys(ID, list(range(100, 108)), 4)
    s.put(first, b"a" * 100)
    s.put(second, b"b" * 100)
    s.flush()  # returns at once, though the writer is waiting
    assert s.lookup(first) is None and s.lookup(second) is None
    quiet.set()
    s.drain(10)
    assert not list((tmp_path / ID.hex()).glob("*.kv"))
    assert s.status()["disk"]["entries"] == 0
    s.put(first, b"c" * 100)  # a put after the flush is written
    s.drain(10)
    assert len(list((tmp_path / ID.hex()).glob("*.kv"))) == 1
    s.close()


def test_under_steady_load_each_write_waits_at_most_max_defer_from_its_queueing(tmp_path):
    import time

    never_quiet = threading.Event()
    s = store(tmp_path, wait_quiet=lambda max_s: never_quiet.wait(max_s), max_defer_s=0.5)
    t0 = time.monotonic()
    for i in range(6):
        s.put(block_keys(ID, list(range(i * 8, i * 8 + 8)), 4), b"s" * 100)
    s.drain(10)
    assert len(list((tmp_path / ID.hex()).glob("*.kv"))) == 6
    assert time.monotonic() - t0 < 2.5  # not 6 x 0.5 s: the deadlines run from queueing, together
    s.close()


def test_writes_stop_waiting_once_the_queue_holds_more_than_the_ram_tier(tmp_path):
    import time

    never_quiet = threading.Event()
    s = store(tmp_path, ram=1000, wait_quiet=lambda max_s: never_quiet.wait(max_s), max_defer_s=30)
    s.put(block_keys(ID, list(range(8)), 4), b"s" * 600)
    s.drain(0.5)
    assert not list((tmp_path / ID.hex()).glob("*.kv"))  # 600 queued bytes: it waits
    t0 = time.monotonic()
    s.put(block_keys(ID, list(range(100, 108)), 4), b"t" * 600)  # 1200 queued bytes > 1000
    while not list((tmp_path / ID.hex()).glob("*.kv")) and time.monotonic() - t0 < 5:
        time.sleep(0.05)
    assert len(list((tmp_path / ID.hex()).glob("*.kv"))) == 1  # the first stopped waiting
    assert time.monotonic() - t0 < 5
    s.drain(0.5)
    assert len(list((tmp_path / ID.hex()).glob("*.kv"))) == 1  # 600 bytes left: the second waits
    never_quiet.set()
    s.drain(10)
    assert len(list((tmp_path / ID.hex()).glob("*.kv"))) == 2
    s.close()


def test_opening_a_store_deletes_other_identities_unused_past_the_limit(tmp_path):
    """An older model file, KV type or build left its directory; one unused for longer than
    prune_after_s goes when a store opens, and nothing else does."""
    day = 86400.0
    old = store(tmp_path, identity=OTHER_ID)
    old.put(block_keys(OTHER_ID, list(range(8)), 4), b"old state")
    old.close()
    stale = tmp_path / OTHER_ID.hex()
    assert any(stale.glob("*.kv"))
    recent = tmp_path / (b"\x03" * 16).hex()
    recent.mkdir()
    (recent / "x.kv").write_bytes(b"kept")
    other_files = tmp_path / "notes"  # not an identity directory: never touched
    other_files.mkdir()
    for path, age in ((stale, 8 * day), (recent, 6 * day), (other_files, 30 * day)):
        os.utime(path, (os.path.getatime(path), os.path.getmtime(path) - age))
    # a store that prunes nothing (0) keeps every directory
    store(tmp_path).close()
    assert stale.is_dir()
    own = tmp_path / ID.hex()
    os.utime(own, (0, os.path.getmtime(own) - 30 * day))  # its own directory, however old, stays
    s = store(tmp_path, prune_after_s=7 * day)
    assert not stale.exists() and recent.is_dir() and other_files.is_dir() and own.is_dir()
    assert os.path.getmtime(own) > os.path.getmtime(recent)  # opening marks it used
    # another identity open in this process is in use, however old its directory
    os.utime(own, (0, os.path.getmtime(own) - 30 * day))
    second = store(tmp_path, identity=b"\x04" * 16, prune_after_s=7 * day)
    assert own.is_dir()
    s.close()
    second.close()


def test_a_directory_two_stores_share_stays_open_until_both_close(tmp_path):
    day = 86400.0
    a, b = store(tmp_path), store(tmp_path)  # (two names on one file and KV types: one identity)
    own = tmp_path / ID.hex()
    a.close()
    a.close()  # closing twice counts once
    os.utime(own, (0, os.path.getmtime(own) - 30 * day))
    store(tmp_path, identity=OTHER_ID, prune_after_s=7 * day).close()
    assert own.is_dir()  # b still has it open
    b.close()
    os.utime(own, (0, os.path.getmtime(own) - 30 * day))
    store(tmp_path, identity=OTHER_ID, prune_after_s=7 * day).close()
    assert not own.exists()


def test_a_discarded_entry_is_gone_from_every_tier_and_its_prefix_can_be_saved_again(tmp_path):
    # (what the prefix cache does with a state llama.cpp refused to restore: kept, it answered every
    # lookup of that prefix and stood where the prefix's own state would be saved)
    keys, path = _written(tmp_path)
    s = store(tmp_path)
    hit = s.lookup(keys)
    assert hit.tier == "disk" and hit.key == keys[-1]
    assert s.lookup(keys).tier == "ram"  # promoted: now in both tiers
    s.discard(hit.key, "refused")
    assert s.lookup(keys) is None and not s.contains(keys) and not path.exists()
    assert s.status()["ram"]["entries"] == 0 and s.status()["ram"]["bytes"] == 0
    assert s.status()["counters"]["discarded"] == 1
    s.discard(hit.key, "again")  # gone already: nothing happens
    s.put(keys, b"its own state")
    assert s.lookup(keys).state == b"its own state"
    s.close()


def test_a_state_larger_than_the_whole_disk_tier_is_not_written(tmp_path):
    # (it was written, synced, and deleted by the trim at once, at every save)
    keys = block_keys(ID, list(range(8)), 4)
    s = store(tmp_path, disk=5000)
    s.put(keys, b"x" * 6000)
    s.put(block_keys(ID, list(range(4)), 4), b"small")
    s.drain(10)
    status = s.status()
    assert status["counters"]["disk_too_large"] == 1 and status["counters"].get("disk_evictions", 0) == 0
    assert status["disk"]["entries"] == 1 and len(list((tmp_path / ID.hex()).glob("*.kv"))) == 1
    assert s.lookup(keys).tier == "ram"  # still served from RAM
    s.close()
