"""Loads on demand: the requests waiting for one share a single load and hold no thread of the
event loop's default executor meanwhile. Waiting in `ModelManager.load` itself took one such
thread per request, so a dozen requests for a loading model stalled everything else run there
(chat templates of other models' requests, /metrics) until the load ended.

The load is the real one, held back by a gate so the test decides when it may finish."""

from __future__ import annotations

import asyncio
import threading

from appliance.config import parse_config
from appliance.engine.manager import ModelManager
from appliance.resources.cores import CoreBudget
from conftest import SMOLLM2, model_entry

# more than the default executor's largest size (32), so the old code blocks on any machine
WAITERS = 40


def _run_with_gated_load(scenario, gate: threading.Event, calls: list[str] | None = None) -> None:
    """A generic-strategy manager for SmolLM2 whose real load waits for `gate`; runs
    `scenario(manager)` on a fresh event loop, then stops the manager."""
    config = parse_config({"policy": {"strategy": "generic"},
                           "models": [model_entry("smollm2-135m", SMOLLM2, n_parallel=1, threads=1)]})
    manager = ModelManager(config, CoreBudget(1))
    real_load = manager.load

    def gated_load(name: str, boot: bool = False):
        if calls is not None:
            calls.append(name)
        gate.wait(60)
        return real_load(name, boot)

    manager.load = gated_load
    manager.start()
    try:
        asyncio.run(scenario(manager))
    finally:
        gate.set()
        manager.stop()


def test_requests_waiting_for_a_load_share_it_and_leave_the_default_executor_free(real_models):
    gate = threading.Event()
    calls: list[str] = []

    async def scenario(manager: ModelManager) -> None:
        waiters = [asyncio.create_task(manager.ready_runner("smollm2-135m")) for _ in range(WAITERS)]
        await asyncio.sleep(0.3)
        assert not any(w.done() for w in waiters)  # all still waiting for the gated load
        # meanwhile the default executor runs other work at once
        assert await asyncio.wait_for(asyncio.to_thread(lambda: "free"), 10) == "free"
        gate.set()
        runners = await asyncio.wait_for(asyncio.gather(*waiters), 120)
        assert {r.state for r in runners} == {"ready"} and len({id(r) for r in runners}) == 1
        assert calls == ["smollm2-135m"]

    _run_with_gated_load(scenario, gate, calls)


def test_a_waiter_that_times_out_leaves_the_load_running_for_the_others(real_models):
    gate = threading.Event()

    async def scenario(manager: ModelManager) -> None:
        patient = asyncio.create_task(manager.load_async("smollm2-135m", 120))
        try:
            await manager.load_async("smollm2-135m", 0.2)
            raise AssertionError("the impatient caller did not time out")
        except TimeoutError:
            pass
        gate.set()
        runner = await patient
        assert runner.state == "ready"

    _run_with_gated_load(scenario, gate)
