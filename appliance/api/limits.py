"""Per-key request rate (a token bucket per minute) and concurrent requests."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass


class LimitExceeded(Exception):
    def __init__(self, limit: str, message: str, retry_after: int):
        super().__init__(message)
        self.limit = limit
        self.retry_after = retry_after


@dataclass
class _Bucket:
    tokens: float
    stamp: float


class KeyLimits:
    """Not thread-safe: used from the event loop only."""

    def __init__(self, rate_per_minute: int | None, concurrent: int | None, clock=time.monotonic):
        self.rate = rate_per_minute
        self.concurrent = concurrent
        self.clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._active: dict[str, int] = {}

    def acquire(self, who: str) -> None:
        """Count a request in; raises LimitExceeded (the request is then not counted)."""
        if self.concurrent is not None and self._active.get(who, 0) >= self.concurrent:
            raise LimitExceeded("concurrent_requests",
                                f"at most {self.concurrent} concurrent requests per key", 1)
        if self.rate is not None:
            now = self.clock()
            b = self._buckets.get(who)
            per_s = self.rate / 60.0
            if b is None:
                b = self._buckets[who] = _Bucket(float(self.rate), now)
            b.tokens = min(float(self.rate), b.tokens + (now - b.stamp) * per_s)
            b.stamp = now
            if b.tokens < 1.0:
                wait = math.ceil((1.0 - b.tokens) / per_s)
                raise LimitExceeded("rate_per_minute", f"at most {self.rate} requests per minute per key", wait)
            b.tokens -= 1.0
            if len(self._buckets) > 10_000:  # forget full buckets (idle clients)
                for k in [k for k, v in self._buckets.items() if v.tokens >= self.rate and k != who]:
                    del self._buckets[k]
        self._active[who] = self._active.get(who, 0) + 1

    def release(self, who: str) -> None:
        n = self._active.get(who, 0) - 1
        if n <= 0:
            self._active.pop(who, None)
        else:
            self._active[who] = n
