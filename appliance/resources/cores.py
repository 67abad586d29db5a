"""Process-wide CPU core budget.

ggml worker threads spin while they wait, so two runners that each start as many threads as
there are cores collapse each other's throughput. Every runner takes cores from this budget
for the length of one `llama_decode` and gives them back afterwards: the sum of busy ggml
threads never exceeds the cores this process may use.
"""

from __future__ import annotations

import os
import threading

import psutil


def usable_cores() -> int:
    """Physical cores this process may run on (affinity respected)."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        allowed = os.cpu_count() or 1
    physical = psutil.cpu_count(logical=False) or allowed
    return max(1, min(allowed, physical))


class CoreBudget:
    """A counting budget of cores; `acquire` grants between 1 and `want` cores."""

    def __init__(self, total: int | None = None):
        self.total = total if total is not None else usable_cores()
        self._free = self.total
        self._cond = threading.Condition()

    def acquire(self, want: int) -> int:
        """Block until at least one core is free, then take up to `want` of them."""
        want = max(1, min(want, self.total))
        with self._cond:
            while self._free < 1:
                self._cond.wait()
            granted = min(want, self._free)
            self._free -= granted
            return granted

    def release(self, n: int) -> None:
        with self._cond:
            self._free += n
            if self._free > self.total:
                raise RuntimeError("core budget released more cores than it granted")
            self._cond.notify_all()

    @property
    def busy(self) -> int:
        with self._cond:
            return self.total - self._free
