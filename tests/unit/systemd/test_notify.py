"""systemd's notify protocol against a real datagram socket: the message format, READY only once
the fixed set is loaded and the port listens, EXTEND_TIMEOUT_USEC and STATUS while loading, and
WATCHDOG=1 pings that stop while the engine is wedged and resume once it moves again.

The wedge is real: the test takes every core of the engine's core budget, so the runner blocks
inside its decode call with a request in flight and its token counters stop."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import pytest

from appliance import systemd
from appliance.config import parse_config
from appliance.engine.manager import ModelManager
from appliance.engine.runner import GenerationRequest
from appliance.resources.cores import CoreBudget
from conftest import SMOLLM2, model_entry
from sdnotify_helper import NotifySocket


@pytest.fixture
def notify_socket(tmp_path):
    s = NotifySocket(str(tmp_path / "notify"))
    yield s
    s.close()


def test_notify_sends_one_datagram(notify_socket):
    assert systemd.notify("READY=1\nSTATUS=hello", {"NOTIFY_SOCKET": notify_socket.addr})
    assert notify_socket.wait_for("READY=1", 2) == "READY=1\nSTATUS=hello"
    assert not systemd.notify("READY=1", {})  # not under systemd: nothing to do
    assert not systemd.notify("READY=1", {"NOTIFY_SOCKET": notify_socket.addr + ".gone"})  # logged, no raise


def test_notify_to_an_abstract_socket():
    name = f"eie-test-{os.getpid()}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind("\0" + name)
    s.settimeout(2)
    try:
        assert systemd.notify("WATCHDOG=1", {"NOTIFY_SOCKET": "@" + name})
        assert s.recv(100) == b"WATCHDOG=1"
    finally:
        s.close()


def test_watchdog_usec_is_for_this_process_only():
    assert systemd.watchdog_usec({"WATCHDOG_USEC": "60000000"}) == 60_000_000
    assert systemd.watchdog_usec({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": str(os.getpid())}) == 60_000_000
    assert systemd.watchdog_usec({"WATCHDOG_USEC": "60000000", "WATCHDOG_PID": "1"}) is None
    assert systemd.watchdog_usec({"WATCHDOG_USEC": "x"}) is None
    assert systemd.watchdog_usec({}) is None


def test_a_blocked_event_loop_is_a_problem():
    loop = asyncio.new_event_loop()
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        health = systemd.EngineHealth(type("M", (), {"runners": {}})(), stall_s=0.5)
        health.loop = loop
        assert health.problem() is None
        loop.call_soon_threadsafe(time.sleep, 1.5)  # a handler that blocks the loop
        time.sleep(0.05)
        assert "event loop" in (health.problem() or "")
        time.sleep(1.5)
        assert health.problem() is None
    finally:
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)
        loop.close()


@pytest.mark.slow
def test_ready_after_load_and_watchdog_stops_while_the_engine_is_wedged(notify_socket, real_models):
    config = parse_config({"models": [model_entry("smollm2-135m", SMOLLM2, n_parallel=1, threads=1)]})
    cores = CoreBudget(1)
    manager = ModelManager(config, cores)
    listening = threading.Event()
    sup = systemd.Supervisor(manager, listening.is_set, stall_s=1.0, poll_s=0.05,
                             env={"NOTIFY_SOCKET": notify_socket.addr, "WATCHDOG_USEC": "600000"})
    sup.start()
    manager.start()
    try:
        notify_socket.wait_for("EXTEND_TIMEOUT_USEC=", 5)
        assert manager.wait_booted(120)
        time.sleep(0.5)
        notify_socket.drain()
        assert not any("READY=1" in m for m in notify_socket.messages)  # loaded, but not listening yet
        assert any("STATUS=loading models: 0/1 ready, loading smollm2-135m" in m for m in notify_socket.messages)
        listening.set()
        assert notify_socket.wait_for("READY=1", 5) == "READY=1\nSTATUS=serving 1 models"
        notify_socket.wait_for("WATCHDOG=1", 2)

        # Wedge: every core is taken, so the runner blocks in llama_decode's core grant.
        assert cores.acquire(1) == 1
        done = threading.Event()
        runner = manager.runners["smollm2-135m"]
        prompt = runner.vocab.tokenize("Hello there", add_special=True, parse_special=False)
        runner.submit(GenerationRequest(prompt=prompt, max_tokens=4),
                      lambda ev: done.set() if not hasattr(ev, "text") else None)
        notify_socket.wait_for("STATUS=wedged: runner smollm2-135m made no progress", 5)
        notify_socket.drain()
        time.sleep(1.0)
        assert not any("WATCHDOG=1" in m for m in notify_socket.drain())  # no pings while wedged
        assert not done.is_set()

        cores.release(1)  # the engine moves again: the request finishes, pings resume
        assert done.wait(30)
        notify_socket.wait_for("WATCHDOG=1", 3)
    finally:
        sup.close()
        manager.stop()
    assert notify_socket.wait_for("STOPPING=1", 2)
