"""Device memory: what the box has and what is in use (CPU RAM here; GPUs when present)."""

from __future__ import annotations

from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class DeviceMemory:
    device: str
    kind: str
    total_bytes: int
    used_bytes: int
    free_bytes: int
    source: str


def devices() -> list[DeviceMemory]:
    vm = psutil.virtual_memory()
    return [
        DeviceMemory(
            device="cpu",
            kind="ram",
            total_bytes=vm.total,
            used_bytes=vm.total - vm.available,
            free_bytes=vm.available,
            source="psutil",
        )
    ]
