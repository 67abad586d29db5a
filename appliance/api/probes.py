"""Threads of their own for the observability probes (device memory, /metrics).

Users poll these endpoints to watch the box; an answer that waits behind other work run off the
event loop (chat templates, config reloads, prefix-store drains) is a stall they see. Two threads:
a probe is short, and a second one covers a probe that hangs in a driver call."""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="probe")


async def run_probe(fn: Callable[[], T]) -> T:
    """Run `fn` on a probe thread and await its result."""
    return await asyncio.get_running_loop().run_in_executor(_pool, fn)
