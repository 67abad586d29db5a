"""Device memory: what the box has and what is in use, each device with the source it came from.

Sources, in order: the devices of the loaded ggml backends (what llama.cpp itself allocates on:
CUDA/HIP report their device memory), NVML (`nvidia-ml-py`) for NVIDIA GPUs no ggml backend
reports, amdgpu sysfs (`mem_info_vram_total/used`) for AMD GPUs no ggml backend reports, and
psutil for the CPU's RAM. No probe raises: a source that fails or is missing gives no devices.
Probes are quick but not free (NVML, a CUDA query): async callers run `devices()` in a thread.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger("eie.memory")

SYSFS_DRM = Path("/sys/class/drm")


@dataclass(frozen=True)
class DeviceMemory:
    device: str
    kind: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    source: str


@dataclass(frozen=True)
class ProcessMemory:
    """This process's resident memory: anonymous (model copies, KV, compute buffers, Python), file
    pages (mapped model files and libraries), shared memory; `source` says where it was read."""

    rss_bytes: int
    anonymous_bytes: int | None
    file_bytes: int | None
    shared_bytes: int | None
    source: str


def process_memory(status: Path = Path("/proc/self/status")) -> ProcessMemory:
    """Linux: RssAnon/RssFile/RssShmem of /proc/self/status (cheap, no smaps walk); elsewhere the
    RSS psutil reports, without the split."""
    try:
        fields = {k: int(v.split()[0]) * 1024 for k, _, v in
                  (line.partition(":") for line in status.read_text().splitlines())
                  if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem")}
        return ProcessMemory(fields["VmRSS"], fields["RssAnon"], fields["RssFile"], fields["RssShmem"], "procfs")
    except (OSError, KeyError, ValueError, IndexError):
        return ProcessMemory(psutil.Process().memory_info().rss, None, None, None, "psutil")


def ram() -> DeviceMemory:
    vm = psutil.virtual_memory()
    return DeviceMemory("cpu", "ram", vm.total, vm.total - vm.available, vm.available, "psutil")


def ggml_devices() -> list[DeviceMemory]:
    """GPU devices of the loaded ggml backends (CPU devices are the RAM, reported by psutil)."""
    try:
        from ..engine import backends  # imports llama_cpp: only when something loaded backends

        if not backends.registry.loaded:
            return []
        out = []
        for d in backends.registry.devices():
            if d.type in ("gpu", "igpu") and d.total_bytes > 0:
                out.append(DeviceMemory(d.name, "vram" if d.type == "gpu" else "shared", d.total_bytes,
                                        d.total_bytes - d.free_bytes, d.free_bytes, f"ggml:{d.backend}"))
        return out
    except Exception as e:  # a probe never raises
        log.debug("ggml device probe failed: %s", e)
        return []


class _Nvml:
    """NVML through nvidia-ml-py, initialised once (it needs the host driver's libnvidia-ml)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._mod = None
        self._tried = False

    def devices(self) -> list[DeviceMemory]:
        try:
            with self._lock:
                if not self._tried:
                    self._tried = True
                    import pynvml

                    pynvml.nvmlInit()
                    self._mod = pynvml
            nv = self._mod
            if nv is None:
                return []
            out = []
            for i in range(nv.nvmlDeviceGetCount()):
                h = nv.nvmlDeviceGetHandleByIndex(i)
                info = nv.nvmlDeviceGetMemoryInfo(h)
                name = nv.nvmlDeviceGetName(h)
                name = name.decode() if isinstance(name, bytes) else str(name)
                out.append(DeviceMemory(f"nvidia{i}", "vram", int(info.total), int(info.used), int(info.free),
                                        f"nvml:{name}"))
            return out
        except Exception as e:  # no driver, no GPU, NVML error: no devices from this source
            log.debug("NVML probe: %s", e)
            return []


nvml = _Nvml()


def amdgpu_devices(drm: Path = SYSFS_DRM) -> list[DeviceMemory]:
    """AMD GPUs from the amdgpu driver's sysfs files (cardN/device/mem_info_vram_*)."""
    out = []
    try:
        cards = sorted(p for p in drm.glob("card*") if p.name[4:].isdigit())
        for card in cards:
            dev = card / "device"
            try:
                if (dev / "driver").resolve().name != "amdgpu":
                    continue
                total = int((dev / "mem_info_vram_total").read_text().strip())
                used = int((dev / "mem_info_vram_used").read_text().strip())
            except (OSError, ValueError):
                continue
            out.append(DeviceMemory(f"amdgpu{card.name[4:]}", "vram", total, used, max(0, total - used),
                                    "sysfs:amdgpu"))
    except OSError:
        pass
    return out


def devices() -> list[DeviceMemory]:
    """Every device: ggml's GPUs, then NVML's and amdgpu's GPUs no ggml backend covers, then RAM."""
    out = ggml_devices()
    backends = {d.source for d in out}
    if "ggml:CUDA" not in backends:
        out += nvml.devices()
    if not backends & {"ggml:ROCm", "ggml:HIP"}:
        out += amdgpu_devices()
    try:
        out.append(ram())
    except Exception as e:  # psutil cannot fail here in practice; keep the promise anyway
        log.debug("psutil probe failed: %s", e)
    return out


def compute_device() -> DeviceMemory:
    """The memory models are loaded into: the first GPU llama.cpp offloads to, else the RAM."""
    gpus = ggml_devices()
    return gpus[0] if gpus else ram()
