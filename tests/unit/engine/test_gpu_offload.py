"""`n_gpu_layers` on a build that offloads to a GPU: `auto` offloads every layer when the model
fits the budget and the most layers that fit when it does not; a number is taken as it is, and
charged for what it puts on the GPU.

This machine has no GPU, so the detection (`native.gpu_backend`) is replaced with monkeypatch, as
in test_kv_on_gpu_builds.py. Everything after it runs for real: the budget arithmetic, the
placement, and a real load of SmolLM2 (where llama.cpp, without a GPU, ignores the layer count).
"""

from __future__ import annotations

import math

import pytest

from appliance.config import parse_config
from appliance.engine import native
from appliance.engine.manager import InsufficientMemory, ModelManager, shape_of
from appliance.resources import offload
from appliance.resources.cores import CoreBudget
from conftest import SMOLLM2, model_entry

MIB = 1 << 20
NAME = "smollm2-135m"


def _manager(monkeypatch, tmp_path, budget_mb: int, **model: object) -> ModelManager:
    monkeypatch.setattr(native, "gpu_backend", lambda: "CUDA")
    cfg = parse_config({"server": {"cache_dir": str(tmp_path)}, "vram": {"budget_mb": budget_mb},
                        "policy": {"strategy": "generic"},
                        "models": [model_entry(NAME, SMOLLM2, n_parallel=1, threads=2, kv_cache={"mode": "q8_0"},
                                               **model)]})
    return ModelManager(cfg, CoreBudget(2))


def _needs(monkeypatch, tmp_path) -> tuple[list[int], float]:
    """The GPU's part of SmolLM2 for each layer count, and the critical watermark's share."""
    m = _manager(monkeypatch, tmp_path, 100_000)
    shape, est = shape_of(SMOLLM2, tmp_path), m.estimate_for(NAME)
    return [offload.device_bytes(shape, est, k) for k in range(offload.all_layers(shape) + 1)], \
        m.config.vram.critical_watermark / 100


def _budget_between(low: int, high: int, critical: float) -> int:
    """A budget_mb whose critical watermark falls between two sizes."""
    mb = math.ceil((low + high) / 2 / critical / MIB)
    assert low <= int(mb * MIB * critical) < high, "the sizes are closer than the budget's 1 MiB steps"
    return mb


def test_auto_offloads_every_layer_when_the_model_fits(monkeypatch, tmp_path, real_models):
    needs, critical = _needs(monkeypatch, tmp_path)
    m = _manager(monkeypatch, tmp_path, math.ceil(needs[-1] / critical / MIB) + 1)
    runner = m.load(NAME)
    try:
        assert runner.state == "ready" and runner.gpu_layers == -1
        assert m.gpu_layers(NAME) == {"offloaded": len(needs) - 1, "of": len(needs) - 1}
        assert m.estimated_gpu_bytes(NAME) == needs[-1]
        assert not [e for e in m.events if e["event"] == "partial_offload"]
    finally:
        m.stop()


def test_auto_offloads_the_most_layers_that_fit(monkeypatch, tmp_path, real_models):
    needs, critical = _needs(monkeypatch, tmp_path)
    m = _manager(monkeypatch, tmp_path, _budget_between(needs[12], needs[13], critical))
    runner = m.load(NAME)
    try:
        assert runner.state == "ready" and runner.gpu_layers == 12
        assert m.gpu_layers(NAME) == {"offloaded": 12, "of": 31}
        assert m.estimated_gpu_bytes(NAME) == needs[12]  # /v1/admin/vram/status: estimate.gpu_memory_bytes
        (event,) = [e for e in m.events if e["event"] == "partial_offload"]
        assert event["detail"].startswith("12 of 31 layers on CUDA: all of them need about ")
    finally:
        m.stop()


def test_a_configured_layer_count_is_kept_and_charged_for_what_it_offloads(monkeypatch, tmp_path, real_models):
    needs, critical = _needs(monkeypatch, tmp_path)
    budget_mb = _budget_between(needs[5], needs[6], critical)
    m = _manager(monkeypatch, tmp_path, budget_mb, n_gpu_layers=5)
    try:
        assert m.load(NAME).gpu_layers == 5
    finally:
        m.stop()
    m = _manager(monkeypatch, tmp_path, budget_mb, n_gpu_layers=6)  # one layer more does not fit
    with pytest.raises(InsufficientMemory, match=f"needs about {needs[6] / MIB:.0f} MiB"):
        m.load(NAME)
    m.stop()


def test_a_budget_without_room_for_the_compute_buffer_refuses_the_load(monkeypatch, tmp_path, real_models):
    needs, critical = _needs(monkeypatch, tmp_path)
    m = _manager(monkeypatch, tmp_path, max(1, int(needs[0] * 0.5 / critical / MIB)))
    with pytest.raises(InsufficientMemory, match=f"needs about {needs[-1] / MIB:.0f} MiB"):
        m.load(NAME)
    assert m.counters["loads_refused"] == 1
    m.stop()
