"""Device memory sources: ggml devices, NVML, amdgpu sysfs, psutil; each device names its source
and no probe raises. This machine has no GPU: the amdgpu sysfs files are written to a temporary
tree (the driver cannot be produced here) and NVML is absent for real."""

from __future__ import annotations

import os

from appliance.resources import memory


def test_the_ram_always_comes_from_psutil_and_nothing_raises():
    devs = memory.devices()
    ram = devs[-1]
    assert (ram.device, ram.kind, ram.source) == ("cpu", "ram", "psutil")
    assert ram.total_bytes > 0 and ram.used_bytes + ram.free_bytes == ram.total_bytes
    assert memory.compute_device().device == "cpu"


def test_nvml_without_a_driver_gives_no_devices():
    assert memory.nvml.devices() == []  # no libnvidia-ml on this machine: no exception either
    assert memory.nvml.devices() == []  # and the failed init is not retried


def _card(drm, n, driver, total=None, used=None):
    dev = drm / f"card{n}" / "device"
    dev.mkdir(parents=True)
    drv = drm / "drivers" / driver
    drv.mkdir(parents=True, exist_ok=True)
    os.symlink(drv, dev / "driver")
    if total is not None:
        (dev / "mem_info_vram_total").write_text(f"{total}\n")
    if used is not None:
        (dev / "mem_info_vram_used").write_text(f"{used}\n")


def test_amdgpu_sysfs(tmp_path):
    gib = 1 << 30
    _card(tmp_path, 0, "amdgpu", 48 * gib, 2 * gib)
    _card(tmp_path, 1, "i915", 1 * gib, 0)  # another vendor's card: ignored
    _card(tmp_path, 2, "amdgpu", None, None)  # no memory files: skipped, no exception
    (tmp_path / "card0-DP-1").mkdir()  # connectors are not cards
    devs = memory.amdgpu_devices(tmp_path)
    assert [(d.device, d.total_bytes, d.used_bytes, d.free_bytes, d.source) for d in devs] == [
        ("amdgpu0", 48 * gib, 2 * gib, 46 * gib, "sysfs:amdgpu")]
    assert memory.amdgpu_devices(tmp_path / "missing") == []


def test_ggml_devices_report_no_gpu_on_a_cpu_build():
    from appliance.engine import native

    native.init_backend()
    assert memory.ggml_devices() == []  # the CPU device is RAM, reported by psutil


def test_process_memory_splits_the_rss_from_procfs():
    proc = memory.process_memory()
    assert proc.source == "procfs" and proc.rss_bytes > 0
    # VmRSS is the sum of the three (the kernel adds them up, in kB)
    assert proc.anonymous_bytes + proc.file_bytes + proc.shared_bytes == proc.rss_bytes


def test_process_memory_without_procfs_falls_back_to_psutil(tmp_path):
    proc = memory.process_memory(tmp_path / "missing")
    assert proc.source == "psutil" and proc.rss_bytes > 0 and proc.file_bytes is None
    partial = tmp_path / "status"
    partial.write_text("Name:\tpython\nVmRSS:\t  1000 kB\n")  # a kernel without the split (before 4.5)
    assert memory.process_memory(partial).source == "psutil"
