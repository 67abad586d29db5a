"""Adaptive KV through the real server: a live sequence keeps generating while its model's KV
cache moves to another type (no reload, no re-prefill), and memory pressure above the low
watermark steps an adaptive model down, without flapping back up."""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from appliance.config import parse_config
from appliance.engine.manager import shape_of
from appliance.resources.estimate import estimate
from conftest import SMOLLM2, model_entry

MIB = 1024 * 1024


def _status(server) -> dict:
    return {m["name"]: m for m in httpx.get(server.base + "/v1/admin/vram/status").json()["models"]}


def _sched(server) -> dict:
    return httpx.get(server.base + "/v1/admin/scheduling/status").json()


@pytest.fixture(scope="module")
def forced_server(server_factory):
    return server_factory({"models": [model_entry("m", SMOLLM2, n_ctx=1024, kv_cache={"mode": "turbo3"})]},
                          "kv-forced")


def test_forced_downgrade_mid_generation(forced_server):
    base = forced_server.base
    before = _status(forced_server)["m"]
    prefill_before = _sched(forced_server)["models"]["m"]["prefill_tokens"]
    chunks: list[dict] = []
    got_some = threading.Event()

    def stream() -> None:
        # End-of-generation tokens are banned: where the change lands depends on timing, and a
        # more compressed cache may end a greedy story at another point; the length must not.
        body = {"model": "m", "prompt": "Once upon a time, in a small village by the sea,", "max_tokens": 96,
                "temperature": 0, "stream": True, "stream_options": {"include_usage": True},
                "logit_bias": {"0": -100, "2": -100, "4": -100}}
        with httpx.stream("POST", base + "/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line[6:]))
                    if len(chunks) >= 8:
                        got_some.set()

    t = threading.Thread(target=stream)
    t.start()
    assert got_some.wait(60)
    r = httpx.post(base + "/v1/admin/kv/convert", json={"model": "m", "mode": "turbo2"}, timeout=120)
    assert r.status_code == 200, r.text
    record = r.json()
    assert record["from"] == ["turbo3", "turbo3"] and record["to"] == ["turbo2", "turbo2"]
    assert record["sequences"] == 1 and record["changed"] is True
    t.join(120)
    assert not t.is_alive()
    # the stream went on to its full length through the change
    assert chunks[-1]["usage"]["completion_tokens"] == 96
    assert [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"] == "length"]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert len(text) > 100
    after = _status(forced_server)["m"]
    assert (after["kv_type_k"], after["kv_type_v"]) == ("turbo2", "turbo2")
    assert after["kv_cache_bytes"] == pytest.approx(before["kv_cache_bytes"] * 20 / 28, rel=0.02)
    assert after["kv_changes"][-1]["reason"] == "requested through the admin API"
    sched = _sched(forced_server)
    assert sched["models"]["m"]["kv_migrations"] == 1
    # no re-prefill: the prompt was prefilled once, before the change
    prompt_tokens = chunks[-1]["usage"]["prompt_tokens"]
    assert sched["models"]["m"]["prefill_tokens"] - prefill_before == prompt_tokens
    assert any(e["event"] == "kv_change" for e in sched["events"])
    assert sched["counters"]["kv_forced_changes"] == 1
    # and the model serves on the new type
    r = httpx.post(base + "/v1/completions", timeout=60,
                   json={"model": "m", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text


def test_convert_refuses_bad_requests(forced_server):
    base = forced_server.base
    r = httpx.post(base + "/v1/admin/kv/convert", json={"model": "m", "mode": "turbo9"})
    assert r.status_code == 400 and "mode" in r.text
    r = httpx.post(base + "/v1/admin/kv/convert", json={"model": "nope", "mode": "q8_0"})
    assert r.status_code == 404
    r = httpx.post(base + "/v1/admin/kv/convert", json={"model": "m", "mode": "q8_0", "extra": 1})
    assert r.status_code == 400


LOW, CRITICAL = 70.0, 95.0


def _pressure_config() -> dict:
    config = {
        "models": [model_entry("big", SMOLLM2, n_ctx=8192, kv_cache={"mode": "f16", "adaptive": True})],
        "vram": {"low_watermark": LOW, "critical_watermark": CRITICAL},
        "inference": {"kv_adaptive": {"cooldown_s": 1, "upgrade_after_s": 2}},
    }
    m = parse_config(config).models[0]
    shape = shape_of(SMOLLM2)
    f16, q8 = estimate(shape, m).total, estimate(shape, m, "q8_0", "q8_0").total
    # the low watermark halfway between the model at f16 and at q8_0
    config["vram"]["budget_mb"] = round((f16 + q8) / 2 / (LOW / 100) / MIB)
    assert f16 <= config["vram"]["budget_mb"] * MIB * CRITICAL / 100  # it loads at f16
    return config


def test_memory_pressure_steps_an_adaptive_model_down_and_it_stays(server_factory):
    srv = server_factory(_pressure_config(), "kv-pressure", wait=False)
    srv.wait_up()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        m = _status(srv).get("big", {})
        if m.get("kv_type_v") == "q8_0":
            break
        time.sleep(0.2)
    m = _status(srv)["big"]
    assert (m["kv_type_k"], m["kv_type_v"]) == ("q8_0", "q8_0"), m
    change = m["kv_changes"][-1]
    assert "above its 70% low watermark" in change["reason"] and change["sequences"] == 0
    status = httpx.get(srv.base + "/v1/admin/vram/status").json()
    budget = status["budgets"]["device"]
    assert budget["used_bytes"] <= budget["low_watermark_bytes"]
    time.sleep(4)  # past upgrade_after_s: f16 would cross the watermark again, so it must stay
    m = _status(srv)["big"]
    assert m["kv_type_v"] == "q8_0" and len(m["kv_changes"]) == 1
    assert _sched(srv)["counters"]["kv_downgrades"] == 1
    r = httpx.post(srv.base + "/v1/completions", timeout=60,
                   json={"model": "big", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
