"""Memory and /metrics probes run on threads of their own: they answer while the event loop's
default executor is taken by other work (config reloads, prefix-store drains, chat templates)."""

from __future__ import annotations

import asyncio
import threading

from appliance.api.probes import run_probe


def test_a_probe_answers_while_the_default_executor_is_busy():
    gate = threading.Event()

    async def scenario() -> None:
        busy = [asyncio.create_task(asyncio.to_thread(gate.wait, 30)) for _ in range(40)]  # > its 32 threads
        await asyncio.sleep(0.2)
        assert await asyncio.wait_for(run_probe(lambda: "answer"), 5) == "answer"
        gate.set()
        await asyncio.gather(*busy)

    try:
        asyncio.run(scenario())
    finally:
        gate.set()
