"""kv_cache.mode auto through the real server: a budget too small for f16 KV makes the auto model
take a compressed type, /v1/admin/vram/status says which and why, and the model serves."""

from __future__ import annotations

import httpx
import pytest
import yaml

from appliance.config import parse_config
from appliance.engine.manager import shape_of
from appliance.resources.estimate import estimate
from conftest import SMOLLM2, model_entry

MIB = 1024 * 1024
LOW = 85.0


def _config() -> dict:
    return {
        "inference": {"kv_cache": {"mode": "auto", "adaptive": True}},
        "models": [
            model_entry("auto", SMOLLM2, n_ctx=4096),  # inherits mode auto and adaptive
            model_entry("fixed", SMOLLM2, n_ctx=4096, kv_cache={"mode": "q8_0"}),  # inherits adaptive only
        ],
        "vram": {"low_watermark": LOW},
    }


def _budget_mb_for_turbo3(config: dict) -> int:
    """A budget whose low watermark holds both models with the auto one at turbo3, not at turbo4."""
    auto, fixed = parse_config(config).models
    shape = shape_of(SMOLLM2)
    need = {t: estimate(shape, auto, t, t).total + estimate(shape, fixed).total for t in ("turbo4", "turbo3")}
    budget_mb = round((need["turbo4"] + need["turbo3"]) / 2 / (LOW / 100) / MIB)
    assert need["turbo3"] <= int(budget_mb * MIB * LOW / 100) < need["turbo4"]
    return budget_mb


@pytest.fixture(scope="module")
def auto_server(server_factory):
    config = _config()
    config["vram"]["budget_mb"] = _budget_mb_for_turbo3(config)
    return server_factory(config, "kv-auto")


def _status(server) -> dict:
    return {m["name"]: m for m in httpx.get(server.base + "/v1/admin/vram/status").json()["models"]}


def test_auto_takes_the_least_compressed_type_that_fits_and_says_why(auto_server):
    models = _status(auto_server)
    auto, fixed = models["auto"], models["fixed"]
    assert auto["state"] == fixed["state"] == "ready"
    assert (auto["kv_mode_configured"], auto["kv_type_k"], auto["kv_type_v"], auto["kv_adaptive"]) == (
        "auto", "turbo3", "turbo3", True)
    reason = auto["kv_choice_reason"]
    assert reason.startswith("turbo3: f16, q8_0, turbo4 exceed the device budget of "), reason
    assert "after the 85% low watermark with 2 models" in reason and reason.endswith("GQA 3 < 6 so K follows V")
    assert (fixed["kv_mode_configured"], fixed["kv_type_k"], fixed["kv_type_v"], fixed["kv_adaptive"]) == (
        "q8_0", "q8_0", "q8_0", True)
    assert fixed["kv_choice_reason"] == "q8_0: configured"
    assert "model auto KV cache (auto) " + reason in auto_server.log()


def test_the_auto_model_serves(auto_server):
    r = httpx.post(auto_server.base + "/v1/completions", timeout=60,
                   json={"model": "auto", "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] > 0


def test_a_reload_decides_again(auto_server):
    """A larger budget lets auto keep f16; the loaded model keeps turbo3 until its next load."""
    config = yaml.safe_load(auto_server.config_path.read_text())
    config["vram"]["budget_mb"] = 64 * 1024
    auto_server.config_path.write_text(yaml.safe_dump(config))
    r = httpx.post(auto_server.base + "/v1/admin/config/reload", timeout=60)
    assert r.status_code == 200, r.text
    assert "vram" in r.json()["applied"]
    auto = _status(auto_server)["auto"]
    assert (auto["kv_type_k"], auto["kv_type_v"]) == ("turbo3", "turbo3")
    assert auto["kv_choice_reason"].startswith("f16: the 2 models fit the device budget of 54.4 GiB")
    assert auto["kv_choice_reason"].endswith("(applies at the next load; loaded with turbo3)")
