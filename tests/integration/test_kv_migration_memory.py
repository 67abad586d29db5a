"""The memory a live KV type change takes, through the real server.

The runner converts the live sequences' states into host memory, frees the old context and only
then creates the new one, so the change peaks at the larger context plus the live states, not at
both contexts. Measured as the server's peak RSS (VmHWM, reset just before the change); the direct
way (`EIE_KV_MIGRATE=direct`: the new context first) is measured the same way beside it, which
shows that the measurement sees a whole context. When the new context cannot be made (here an
address-space limit the larger KV does not fit), the old types come back and the live sequence
goes on to its full length."""

from __future__ import annotations

import json
import os
import resource
import threading
from pathlib import Path

import httpx
import pytest

from conftest import SMOLLM2, model_entry

# 2 sequences of 8192 cells: SmolLM2's f16 KV is 360 MiB, its q8_0 KV 191 MiB
KV = {"n_ctx": 8192, "n_parallel": 2}
MAX_TOKENS = 120


def _status_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _model(server) -> dict:
    return next(m for m in httpx.get(server.base + "/v1/admin/vram/status").json()["models"] if m["name"] == "m")


class _Stream:
    """A greedy completion streamed in a thread, its end-of-generation tokens banned: it runs to
    MAX_TOKENS whatever happens to the KV meanwhile."""

    def __init__(self, base: str):
        self.chunks: list[dict] = []
        self.started = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(base,))
        self._thread.start()
        assert self.started.wait(60)

    def _run(self, base: str) -> None:
        body = {"model": "m", "prompt": "The history of the lighthouse keepers on the northern coast",
                "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}, "logit_bias": {"0": -100, "2": -100}}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    self.chunks.append(json.loads(line[6:]))
                    if len(self.chunks) >= 8:
                        self.started.set()

    def completion_tokens(self) -> int:
        self._thread.join(120)
        assert not self._thread.is_alive()
        return self.chunks[-1]["usage"]["completion_tokens"]


@pytest.mark.parametrize("way", ["staged", "direct"])
def test_a_kv_change_peaks_at_the_larger_context_not_at_both(server_factory, way):
    env = {"EIE_KV_MIGRATE": "direct"} if way == "direct" else {}
    server = server_factory({"models": [model_entry("m", SMOLLM2, **KV, kv_cache={"mode": "f16"})]},
                            f"kv-peak-{way}", env=env)
    pid = server.proc.pid
    old_kv = _model(server)["kv_cache_bytes"]
    stream = _Stream(server.base)
    rss = _status_bytes(pid, "VmRSS")
    Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM starts again from VmRSS
    r = httpx.post(server.base + "/v1/admin/kv/convert", json={"model": "m", "mode": "q8_0"}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json()["sequences"] == 1
    growth = _status_bytes(pid, "VmHWM") - rss
    new_kv = _model(server)["kv_cache_bytes"]
    assert new_kv == pytest.approx(old_kv * 34 / 64, rel=0.02)  # q8_0: 34 bytes a block of 32
    if way == "staged":
        # the old context was gone before the new one came: the peak is the live state alone
        assert growth < new_kv / 4, (growth, new_kv)
    else:
        assert growth > 0.8 * new_kv, (growth, new_kv)
    assert stream.completion_tokens() == MAX_TOKENS


def test_a_kv_change_that_cannot_get_its_memory_puts_the_old_types_back(server_factory):
    server = server_factory({"models": [model_entry("m", SMOLLM2, **KV, kv_cache={"mode": "q8_0"})]},
                            "kv-revert")
    pid = server.proc.pid
    stream = _Stream(server.base)
    _, hard = resource.prlimit(pid, resource.RLIMIT_AS)
    # room for the staged state and the q8_0 context it frees, not for the f16 one (360 MiB)
    resource.prlimit(pid, resource.RLIMIT_AS, (_status_bytes(pid, "VmSize") + 64 * 2**20, hard))
    try:
        r = httpx.post(server.base + "/v1/admin/kv/convert", json={"model": "m", "mode": "f16"}, timeout=120)
    finally:
        resource.prlimit(pid, resource.RLIMIT_AS, (hard, hard))
    assert r.status_code == 503, r.text
    err = r.json()["error"]
    assert err["code"] == "kv_migration_reverted"
    assert "back on q8_0" in err["message"] and "1 live sequence" in err["message"]
    assert stream.completion_tokens() == MAX_TOKENS
    model = _model(server)
    assert (model["kv_type_k"], model["kv_type_v"]) == ("q8_0", "q8_0")
    metrics = httpx.get(server.base + "/metrics").text
    assert 'eie_kv_type_change_reverts_total{model="m"} 1.0' in metrics
    assert 'eie_kv_type_changes_total{model="m"} 0.0' in metrics
    # with the memory there, the same change goes through, and the model answers
    r = httpx.post(server.base + "/v1/admin/kv/convert", json={"model": "m", "mode": "f16"}, timeout=120)
    assert r.status_code == 200, r.text
    r = httpx.post(server.base + "/v1/completions", json={"model": "m", "prompt": "Hello", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200, r.text
    assert os.path.exists(f"/proc/{pid}")
