"""A stop during a load (engine/load_cancel.py): llama.cpp's weight load, K centring's calibration
and the speculative exactness probe give up at their next check, so `systemctl stop` during a
slow first boot ends well inside the unit's TimeoutStopSec instead of in SIGKILL."""

from __future__ import annotations

import logging
import signal
import threading
import time

import httpx
import llama_cpp as lc
import pytest

from appliance.config import parse_config
from appliance.engine import k_centering, native
from appliance.engine.load_cancel import LoadCancelled
from appliance.engine.manager import ModelManager
from appliance.engine.speculative.exactness import exact_rows
from appliance.resources.cores import CoreBudget
from conftest import GEMMA3, SMOLLM2, model_entry


def _stopped() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


def _load(path, cancel: threading.Event | None = None, **kw) -> native.LoadedModel:
    return native.load(path, n_ctx_total=512, n_seq_max=1, n_batch=64, n_threads=2, type_k="f16",
                       type_v="f16", flash_attn="auto", cancel=cancel, **kw)


def test_a_set_flag_stops_llama_cpp_reading_the_weights(real_models, caplog):
    caplog.set_level(logging.DEBUG, logger="eie.llama")
    with pytest.raises(LoadCancelled):
        _load(SMOLLM2, _stopped())
    # llama.cpp itself gave up (through the progress callback), not a check after a whole load
    assert any("cancelled model load" in r.getMessage() for r in caplog.records)


def test_an_unset_flag_leaves_the_load_alone(real_models):
    loaded = _load(SMOLLM2, threading.Event())
    try:
        assert loaded.ctx and loaded.n_vocab > 0
    finally:
        loaded.free()


def test_k_centring_stops_before_its_next_calibration_chunk(real_models, tmp_path):
    loaded = _load(SMOLLM2)
    try:
        with pytest.raises(LoadCancelled):
            k_centering.centers_for(loaded.model, SMOLLM2, 2, tmp_path, None, _stopped())
        assert not list(tmp_path.rglob("*")), "a cancelled calibration cached means"
    finally:
        loaded.free()


def test_the_exactness_probe_stops_and_leaves_the_sequence_empty(real_models):
    loaded = _load(SMOLLM2)
    try:
        with pytest.raises(LoadCancelled):
            exact_rows(loaded.ctx, loaded.n_vocab, 5, cancel=_stopped())
        assert lc.llama_memory_seq_pos_max(lc.llama_get_memory(loaded.ctx), 0) == -1
    finally:
        loaded.free()


def test_stopping_the_manager_mid_boot_cancels_the_load(real_models, tmp_path):
    """Gemma's first load (K centring to measure, the exactness probe for its drafts) is held at
    its first calibration decode by taking the only core; the stop comes there, then the core is
    given back. Before cancelling existed, the load ran on to the end and the model came up."""
    config = parse_config({
        "server": {"cache_dir": str(tmp_path / "cache")},
        "models": [model_entry("gemma3-270m", GEMMA3, n_parallel=1, threads=1,
                               speculative={"sources": ["ngram"]})],
    })
    cores = CoreBudget(1)
    manager = ModelManager(config, cores)
    held = cores.acquire(1)
    manager.start()
    deadline = time.monotonic() + 120
    while cores.waiting == 0:  # the calibration's first decode waits for the core
        assert time.monotonic() < deadline, "the load never reached K centring's calibration"
        assert manager.runners["gemma3-270m"].state == "loading", manager.runners["gemma3-270m"].error
        time.sleep(0.02)
    stopper = threading.Thread(target=manager.stop)
    stopper.start()
    while not manager._stop.is_set():
        time.sleep(0.01)
    t0 = time.monotonic()
    cores.release(held)
    stopper.join(60)
    assert not stopper.is_alive(), "the manager did not stop"
    assert time.monotonic() - t0 < 10
    events = [(e["event"], e["model"]) for e in manager.events]
    assert ("load_cancelled", "gemma3-270m") in events and ("load", "gemma3-270m") not in events
    assert manager.counters["load_failures"] == 0
    assert not (tmp_path / "cache" / "k-centers").exists() or not any((tmp_path / "cache" / "k-centers").iterdir())


def test_sigterm_during_the_first_boot_ends_the_server_at_once(server_factory, tmp_path):
    """The unit's stop: SIGTERM while both models still load (a fresh cache directory, so K
    centring and the exactness probe run) ends the process cleanly in seconds."""
    srv = server_factory({"server": {"cache_dir": str(tmp_path / "cache")},
                          "models": [model_entry("smollm2-135m", SMOLLM2, speculative={"sources": ["ngram"]}),
                                     model_entry("gemma3-270m", GEMMA3, speculative={"sources": ["ngram"]})]},
                         "sigterm-boot", wait=False)
    srv.wait_up()
    health = httpx.get(srv.base + "/health", timeout=5).json()
    assert health["status"] == "loading", f"the boot ended before the test could stop it: {health}"
    t0 = time.monotonic()
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(timeout=30) == 0, srv.log()
    assert time.monotonic() - t0 < 10, srv.log()
    assert "load cancelled: the server is stopping" in srv.log()
