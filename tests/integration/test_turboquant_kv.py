"""TurboQuant KV cache types inside llama.cpp (native/patches): models load and serve with them,
and the KV buffers llama.cpp allocates have the layout's size."""

from __future__ import annotations

import httpx
import pytest

from conftest import GEMMA3, SMOLLM2, model_entry

RATIO = {"turbo4": 35 / 128, "turbo3": 28 / 128, "turbo2": 20 / 128}


@pytest.fixture(scope="module")
def turbo_server(server_factory):
    models = [model_entry("f16", SMOLLM2, n_ctx=1024)]
    for mode in RATIO:
        models.append(model_entry(mode, SMOLLM2, n_ctx=1024, kv_cache={"mode": mode}))
    models.append(model_entry("mixed", SMOLLM2, n_ctx=1024, kv_cache={"mode": "turbo3", "k": "q8_0"}))
    models.append(model_entry("gemma-turbo4", GEMMA3, n_ctx=1024, kv_cache={"mode": "turbo4"}))
    return server_factory({"models": models}, "turbo")


def test_turbo_kv_buffers_have_the_layouts_size(turbo_server):
    status = httpx.get(turbo_server.base + "/v1/admin/vram/status").json()
    kv = {m["name"]: m for m in status["models"]}
    base = kv["f16"]["kv_cache_bytes"]
    for mode, ratio in RATIO.items():
        assert kv[mode]["state"] == "ready"
        assert kv[mode]["kv_type_k"] == kv[mode]["kv_type_v"] == mode
        # llama.cpp reports MiB with two decimals: allow that rounding.
        assert abs(kv[mode]["kv_cache_bytes"] / base - ratio) < 0.002, (mode, kv[mode]["kv_cache_bytes"] / base)
        assert kv[mode]["estimate"]["kv_cache_bytes"] == pytest.approx(kv[mode]["kv_cache_bytes"], rel=0.01)
    assert kv["mixed"]["kv_type_k"] == "q8_0" and kv["mixed"]["kv_type_v"] == "turbo3"


@pytest.mark.parametrize("model", ["turbo4", "turbo3", "turbo2", "mixed", "gemma-turbo4"])
def test_turbo_kv_models_serve(turbo_server, model):
    r = httpx.post(turbo_server.base + "/v1/completions", timeout=60,
                   json={"model": model, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] > 0


def test_turbo4_keeps_the_easy_answer(turbo_server):
    r = httpx.post(turbo_server.base + "/v1/completions", timeout=60,
                   json={"model": "turbo4", "prompt": "The capital of France is", "max_tokens": 1, "temperature": 0})
    assert r.json()["choices"][0]["text"] == " Paris"
