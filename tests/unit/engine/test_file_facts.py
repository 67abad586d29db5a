"""Facts read from model files (content hash, GGUF dimensions), kept on disk across restarts."""

from __future__ import annotations

import hashlib
import json
import time

from appliance.engine import prefix


def test_the_hash_is_kept_on_disk_and_a_rewritten_file_is_hashed_again(tmp_path):
    model = tmp_path / "m.gguf"
    model.write_bytes(b"a" * 100_000)
    cache = tmp_path / "cache"
    want = hashlib.sha256(model.read_bytes()).hexdigest()
    assert prefix.file_sha256(model, cache) == want
    stored = list((cache / "file-sha256").iterdir())
    assert len(stored) == 1 and json.loads(stored[0].read_text()) == want

    prefix._file_hashes.clear()  # a restart: only the disk copy is left
    stored[0].write_text(json.dumps("f" * 64))  # proves the disk copy is what is read
    assert prefix.file_sha256(model, cache) == "f" * 64

    prefix._file_hashes.clear()
    stored[0].write_text("garbage")  # unreadable: hashed again
    assert prefix.file_sha256(model, cache) == want

    time.sleep(0.01)
    model.write_bytes(b"b" * 100_000)  # same size, new content: new ctime, new key
    assert prefix.file_sha256(model, cache) == hashlib.sha256(model.read_bytes()).hexdigest()


def test_gguf_dimensions_are_read_once_per_file_version(tmp_path, monkeypatch):
    from appliance.engine import gguf_header, manager
    from conftest import SMOLLM2

    manager._shapes.clear()
    first = manager.shape_of(SMOLLM2, tmp_path)
    assert first.n_layer == 30 and first.n_head_kv == 3
    manager._shapes.clear()  # a restart

    def no_header(path):
        raise AssertionError("the header was read again")

    monkeypatch.setattr(gguf_header, "read", no_header)
    assert manager.shape_of(SMOLLM2, tmp_path) == first
    manager._shapes.clear()
    for entry in (tmp_path / manager.SHAPE_FACTS).iterdir():
        entry.write_text('{"n_layer": 1}')  # from another version of the code: read again
    monkeypatch.undo()
    assert manager.shape_of(SMOLLM2, tmp_path) == first
