"""Facts read from model files (content hash, GGUF dimensions), kept on disk across restarts."""

from __future__ import annotations

import hashlib
import json
import time

from appliance.engine import prefix
from appliance.resources import file_facts


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
    for entry in (tmp_path / file_facts.GGUF_SHAPE).iterdir():
        entry.write_text('{"n_layer": 1}')  # from another version of the code: read again
    monkeypatch.undo()
    assert manager.shape_of(SMOLLM2, tmp_path) == first


def test_a_file_that_cannot_be_read_is_read_once_per_version(tmp_path, monkeypatch):
    """The child read of a bad file runs once: the estimate and the pre-load check that follow
    get the same error; a rewritten file is read afresh."""
    import pytest

    from appliance.engine import gguf_header, manager

    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF but not really" * 10)
    reads: list = []
    real = gguf_header.read
    monkeypatch.setattr(gguf_header, "read", lambda path: reads.append(path) or real(path))
    errors = set()
    for _ in range(3):
        with pytest.raises(ValueError) as e:
            manager.shape_of(bad, tmp_path / "cache")
        errors.add(str(e.value))
    assert len(reads) == 1 and errors == {"bad.gguf is not a model llama.cpp can read: this GGUF file is version "
                                          "1953849888 but this software only supports up to version 3"}
    time.sleep(0.01)
    bad.write_bytes(b"still not a GGUF" * 10)  # a new version: read again
    with pytest.raises(ValueError):
        manager.shape_of(bad, tmp_path / "cache")
    assert len(reads) == 2


def test_a_load_reads_its_headers_outside_the_managers_lock(tmp_path, monkeypatch, real_models):
    """Each header read is a child process (0.3-1.3 s): under the lock it would hold up the other
    models' loads and the janitor."""
    import shutil

    from appliance.config import parse_config
    from appliance.engine import gguf_header, manager as manager_module
    from appliance.engine.manager import ModelManager
    from appliance.resources.cores import CoreBudget
    from conftest import SMOLLM2, model_entry

    shutil.copyfile(SMOLLM2, tmp_path / "target.gguf")
    shutil.copyfile(SMOLLM2, tmp_path / "draft.gguf")  # new files: nothing cached for them
    config = parse_config({
        "server": {"cache_dir": str(tmp_path / "cache")}, "model_dir": str(tmp_path),
        "policy": {"strategy": "generic"},
        "models": [model_entry("draft", "draft.gguf", n_ctx=256, n_parallel=1, threads=1),
                   model_entry("m", "target.gguf", n_ctx=256, n_parallel=1, threads=1,
                               speculative={"sources": ["draft_model"], "draft_model": "draft"})]})
    manager = ModelManager(config, CoreBudget(1))
    held: dict[str, bool] = {}
    real = gguf_header.read

    def read(path):
        held[path.name] = manager._lock._is_owned()
        return real(path)

    monkeypatch.setattr(gguf_header, "read", read)
    manager_module._shapes.clear()
    try:
        assert manager.load("m").state == "ready"
    finally:
        manager.stop()
    assert held == {"target.gguf": False, "draft.gguf": False}


def test_every_kind_of_fact_kept_is_listed_in_kinds():
    """KINDS is what tests/conftest.py shares between a run's servers: a kind kept but not listed
    there would be measured again by every server."""
    import re
    from pathlib import Path

    root = Path(file_facts.__file__).resolve().parents[1]
    uses = [m.strip() for f in root.rglob("*.py")
            for m in re.findall(r"file_facts\.(?:load|save)\([^,]+,([^,]+),", f.read_text())]
    assert len(uses) >= 8  # a load and a save of each kind
    assert all(re.fullmatch(r"file_facts\.[A-Z0-9_]+", u) for u in uses), uses  # named, not a literal
    assert {getattr(file_facts, u.split(".")[1]) for u in uses} == set(file_facts.KINDS)
