"""ggml backend modules (GGML_BACKEND_DL): found where the build put them, scored, the best loaded
into the registry of the libggml that libllama uses, and that registry serving real loads."""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

import llama_cpp as lc

from appliance.engine import backends, native


def test_the_registry_is_the_one_libllama_uses():
    native.init_backend()
    reg = backends.registry
    assert reg.loaded
    # The libggml bound is the copy the dynamic loader mapped for libllama (a soname copy such as
    # libggml.so.0), not a second copy opened by path with its own, empty registry.
    assert reg.libggml is not None and reg.libggml.name.startswith("libggml.so")
    with open("/proc/self/maps") as f:
        assert str(reg.libggml) in f.read()
    names = {b.name for b in reg.backends}
    assert "cpu" in names
    # llama.cpp sees what we registered: it reports the same device count.
    assert lc.llama_max_devices() >= 1
    assert reg.lib.ggml_backend_dev_count() == len(reg.devices()) >= 1


def test_the_cpu_module_is_chosen_with_a_score():
    native.init_backend()
    cpu = next(b for b in backends.registry.backends if b.name == "cpu")
    assert cpu.chosen and Path(cpu.chosen).is_file()
    assert cpu.registered == "CPU"
    assert cpu.score is not None and cpu.score > 0, cpu
    devs = [d for d in backends.registry.devices() if d.type == "cpu"]
    assert devs and devs[0].backend == "CPU" and devs[0].total_bytes > 0


def test_cpu_features_come_from_the_loaded_module():
    native.init_backend()
    feats = backends.registry.features()
    assert "CPU" in feats
    if platform.machine() == "x86_64":
        assert feats["CPU"].get("AVX2") == "1"  # every x86 build here targets AVX2 or better


def test_choose_takes_the_best_variant_and_reports_broken_modules(tmp_path):
    native.init_backend()
    cpu = Path(next(b for b in backends.registry.backends if b.name == "cpu").chosen)
    # Two real variants of the same module (same score) and one file that is no library.
    shutil.copy(cpu, tmp_path / "libggml-cpu-a.so")
    shutil.copy(cpu, tmp_path / "libggml-cpu-b.so")
    (tmp_path / "libggml-cuda.so").write_text("not an ELF file")
    (tmp_path / "libggml-base.so").write_text("skipped: not a backend")
    (tmp_path / "libggml-cpu.so.0").write_text("skipped: not *.so")
    found = backends.find_modules([tmp_path])
    assert list(found) == ["cuda", "cpu"]  # ggml's order: GPU backends before the CPU
    assert [p.name for p in found["cpu"]] == ["libggml-cpu-a.so", "libggml-cpu-b.so"]
    chosen = backends.choose("cpu", found["cpu"])
    assert chosen.chosen and chosen.score and chosen.score > 0
    assert all(c.score == chosen.score for c in chosen.candidates)
    cuda = backends.choose("cuda", found["cuda"])
    assert cuda.chosen is None and "libggml-cuda.so" in cuda.error
    assert cuda.candidates[0].error


def test_module_dirs_start_next_to_the_mapped_libggml():
    native.init_backend()
    dirs = backends.module_dirs(backends.registry.libggml)
    assert dirs[0] == backends.registry.libggml.parent
    assert len({d.resolve() for d in dirs}) == len(dirs)


def test_loading_is_idempotent():
    native.init_backend()
    first = list(backends.registry.backends)
    n = backends.registry.lib.ggml_backend_reg_count()
    assert backends.registry.load() == first
    assert backends.registry.lib.ggml_backend_reg_count() == n


def test_a_model_loads_through_the_registered_cpu_backend():
    from conftest import SMOLLM2

    loaded = native.load(SMOLLM2, n_ctx_total=512, n_seq_max=1, n_batch=64, n_threads=1,
                         type_k="f16", type_v="f16", flash_attn="auto")
    try:
        assert loaded.buffers.weights > 0
    finally:
        loaded.free()
