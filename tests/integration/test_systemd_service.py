"""A real `eie serve` under systemd's protocol (a test socket as $NOTIFY_SOCKET): STATUS and
EXTEND_TIMEOUT_USEC while the models load, READY=1 once /health is 200, watchdog pings at a third
of WATCHDOG_USEC, STOPPING=1 and a clean exit on SIGTERM."""

from __future__ import annotations

import signal
import time

import httpx

from conftest import GEMMA3, SMOLLM2, model_entry
from sdnotify_helper import NotifySocket


def test_eie_serve_speaks_sd_notify(server_factory, tmp_path):
    sock = NotifySocket(str(tmp_path / "notify"))
    try:
        srv = server_factory(
            {"models": [model_entry("smollm2-135m", SMOLLM2), model_entry("gemma3-270m", GEMMA3)]},
            "notify", wait=False, env={"NOTIFY_SOCKET": sock.addr, "WATCHDOG_USEC": "1500000"},
        )
        ready = sock.wait_for("READY=1", 120)
        assert httpx.get(srv.base + "/health", timeout=5).status_code == 200  # READY means served
        assert ready == "READY=1\nSTATUS=serving 2 models"
        before = sock.messages[: sock.messages.index(ready)]
        assert any(m.startswith("EXTEND_TIMEOUT_USEC=") and "STATUS=loading models" in m for m in before)
        sock.drain()
        time.sleep(2.0)
        pings = [m for m in sock.drain() if m == "WATCHDOG=1"]
        assert 2 <= len(pings) <= 6, pings  # every 0.5 s
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.proc.wait(30) == 0
        # as the drain begins (it came once the process was on its way out), with the time the
        # drain may take asked for past the unit's TimeoutStopSec
        stopping = sock.wait_for("STOPPING=1", 5)
        assert "STATUS=draining: 0 requests in flight, up to 20s" in stopping, stopping
        assert "EXTEND_TIMEOUT_USEC=35000000" in stopping, stopping
        sock.drain()
        assert sum("STOPPING=1" in m for m in sock.messages) == 1  # once
    finally:
        sock.close()
