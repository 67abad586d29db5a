"""TurboQuant KV types on a llama.cpp build that offloads to a GPU (they have CPU kernels only).

This machine has no GPU and its llama.cpp build has no GPU backend, so the fault cannot be
produced for real here: these tests replace the detection (`native.gpu_backend`, or what it reads
from llama_cpp) with monkeypatch. Everything after the detection runs for real.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from appliance.config import parse_config
from appliance.engine import manager as manager_mod
from appliance.engine import native
from conftest import SMOLLM2


def test_this_cpu_build_offloads_nothing():
    assert native.gpu_backend() is None


def test_the_backend_is_named_after_its_library(monkeypatch, tmp_path):
    monkeypatch.setattr(native.lc, "llama_supports_gpu_offload", lambda: True)
    monkeypatch.setattr(native.lc, "__file__", str(tmp_path / "llama_cpp" / "__init__.py"))
    (tmp_path / "llama_cpp" / "lib").mkdir(parents=True)
    assert native.gpu_backend() == "GPU"  # statically linked: no library to name it
    (tmp_path / "llama_cpp" / "lib" / "libggml-cuda.so").touch()
    assert native.gpu_backend() == "CUDA"


@pytest.mark.parametrize("type_k,type_v", [("turbo3", "turbo3"), ("q8_0", "turbo3")])
def test_an_explicit_turbo_type_fails_the_load_with_the_way_out(monkeypatch, tmp_path, type_k, type_v):
    monkeypatch.setattr(native, "gpu_backend", lambda: "CUDA")
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"")  # refused before llama.cpp reads it
    with pytest.raises(native.LoadError) as e:
        native.load(gguf, n_ctx_total=256, n_seq_max=1, n_batch=32, n_threads=1, type_k=type_k, type_v=type_v,
                    flash_attn="auto")
    assert str(e.value) == "turbo3 KV cache has no CUDA kernels in this build; use q8_0/q4_0 or run on CPU"


def test_q8_0_and_q4_0_pass_the_check():
    assert native.turbo_offload_problem("q8_0", "q4_0", "CUDA") is None
    assert native.turbo_offload_problem("turbo4", "turbo4", None) is None


def test_the_manager_does_not_choose_turbo_types_on_a_gpu_build(monkeypatch):
    monkeypatch.setattr(native, "gpu_backend", lambda: "CUDA")
    # 4096 × 2 cells of SmolLM2's KV are 180 MiB at f16: a 300 MiB budget cannot hold it.
    cfg = parse_config({"vram": {"budget_mb": 300}, "models": [
        {"name": "a", "path": str(SMOLLM2), "n_ctx": 4096, "n_parallel": 2, "kv_cache": {"mode": "auto"}},
        {"name": "t", "path": str(SMOLLM2), "kv_cache": {"mode": "turbo2"}}]})
    manager = manager_mod.ModelManager(cfg)
    kv = manager.runners["a"].cfg.kv_cache
    assert (kv.type_k, kv.type_v) == ("q4_0", "q4_0")
    status = manager.kv_status("a")
    assert status["kv_mode_configured"] == "auto"
    assert "turbo types skipped: this build offloads to CUDA" in status["kv_choice_reason"]
    assert "turbo2 KV cache has no CUDA kernels in this build" in manager.kv_status("t")["kv_choice_reason"]
