"""Adaptive KV decisions: down under memory or latency pressure, up again with hysteresis."""

from __future__ import annotations

from appliance.kv.adaptive import Controller, ModelKv, Pressure

RUNGS = [("turbo3", "turbo3"), ("turbo2", "turbo2")]
FULL = [("f16", "f16"), ("q8_0", "q8_0"), ("turbo4", "turbo4"), ("turbo3", "turbo3"), ("turbo2", "turbo2")]
MB = 2**20


def model(name, current, rungs=FULL, kv=(100, 53, 27, 22, 16), **kw):
    return ModelKv(name, rungs, current, [k * MB for k in kv[: len(rungs)]], **kw)


def pressure(used_mb, cap_mb=1000, low_pct=80):
    return Pressure(used_mb * MB, cap_mb * MB, cap_mb * low_pct // 100 * MB, "RAM")


def test_memory_above_low_watermark_steps_the_largest_kv_down_one_rung():
    c = Controller()
    a, b = model("a", ("f16", "f16")), model("b", ("q8_0", "q8_0"))
    change = c.decide([a, b], pressure(850), now=100)
    assert change.model == "a" and change.to == ("q8_0", "q8_0") and change.direction == "down"
    assert "low watermark" in change.reason


def test_no_change_below_the_watermark_or_at_the_last_rung():
    c = Controller()
    assert c.decide([model("a", ("f16", "f16"))], pressure(500), now=0) is None
    assert c.decide([model("a", ("turbo2", "turbo2"))], pressure(990), now=0) is None


def test_a_model_changes_at_most_once_per_cooldown():
    c = Controller(cooldown_s=10)
    a = model("a", ("f16", "f16"))
    assert c.decide([a], pressure(900), now=0) is not None
    a = model("a", ("q8_0", "q8_0"))
    assert c.decide([a], pressure(900), now=5) is None
    assert c.decide([a], pressure(900), now=11).to == ("turbo4", "turbo4")


def test_latency_bound_steps_down():
    c = Controller()
    m = model("a", ("turbo3", "turbo3"), rungs=RUNGS, kv=(22, 16), decode_ms=40.0, max_decode_ms=25.0)
    change = c.decide([m], None, now=0)
    assert change.to == ("turbo2", "turbo2") and "latency" in change.reason


def test_upgrade_waits_for_calm_and_room_below_the_watermark():
    c = Controller(upgrade_after_s=30, margin=0.05)
    m = model("a", ("q8_0", "q8_0"))
    assert c.decide([m], pressure(790), now=0) is None  # calm starts now; 790 + 47 > 800 - 50 anyway
    assert c.decide([m], pressure(600), now=20) is None  # not calm for long enough
    up = c.decide([m], pressure(600), now=31)
    assert up.direction == "up" and up.to == ("f16", "f16")
    # a model already at its starting rung never goes above it
    assert c.decide([model("b", ("f16", "f16"))], pressure(100), now=100) is None


def test_no_upgrade_when_it_would_cross_the_watermark_again():
    c = Controller(upgrade_after_s=0, margin=0.05)
    m = model("a", ("q8_0", "q8_0"))
    assert c.decide([m], pressure(720), now=0) is None  # 720 + 47 > 750: would flap
    assert c.decide([m], pressure(690), now=1).direction == "up"


def test_pressure_resets_the_calm_period():
    c = Controller(upgrade_after_s=30, cooldown_s=0)
    m = model("a", ("q8_0", "q8_0"))
    c.decide([m], pressure(100), now=0)
    c.decide([model("a", ("turbo2", "turbo2"))], pressure(900), now=20)  # pressure (no rung left)
    assert c.decide([m], pressure(100), now=35) is None  # calm again only since 35
    assert c.decide([m], pressure(100), now=66).direction == "up"
