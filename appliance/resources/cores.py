"""Process-wide CPU core budget.

ggml worker threads spin while they wait, so two runners that each start as many threads as
there are cores collapse each other's throughput. Every runner takes cores from this budget
for the length of one `llama_decode` and gives them back afterwards: the sum of busy ggml
threads never exceeds the cores this process may use.
"""

from __future__ import annotations

import os
import threading
import time

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
        self._last_held = 0.0  # time.monotonic() when a core was last given back
        self._waiting = 0  # threads blocked in acquire

    def acquire(self, want: int) -> int:
        """Block until at least one core is free, then take up to `want` of them."""
        want = max(1, min(want, self.total))
        with self._cond:
            self._waiting += 1
            try:
                while self._free < 1:
                    self._cond.wait()
            finally:
                self._waiting -= 1
            granted = min(want, self._free)
            self._free -= granted
            return granted

    def release(self, n: int) -> None:
        with self._cond:
            self._free += n
            if self._free > self.total:
                raise RuntimeError("core budget released more cores than it granted")
            self._last_held = time.monotonic()
            self._cond.notify_all()

    def wait_quiet(self, quiet_s: float, max_wait_s: float) -> bool:
        """Block until no core has been held for `quiet_s` seconds (True), or `max_wait_s`
        passed (False). Background work (the prefix cache's disk writes) waits here: on a small
        box it would otherwise take a core from spinning ggml threads mid-decode. A runner
        between two steps holds no core for a moment only, hence the quiet period."""
        deadline = time.monotonic() + max_wait_s
        with self._cond:
            while True:
                now = time.monotonic()
                if self._free == self.total and now - self._last_held >= quiet_s:
                    return True
                if now >= deadline:
                    return False
                wake = deadline if self._free < self.total else min(deadline, self._last_held + quiet_s)
                self._cond.wait(max(0.001, wake - now))

    @property
    def waiting(self) -> int:
        """Threads blocked in `acquire` now."""
        with self._cond:
            return self._waiting

    @property
    def busy(self) -> int:
        with self._cond:
            return self.total - self._free
