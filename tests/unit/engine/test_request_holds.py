"""A request that took a model's runner holds the model in use until it ends: before its
sequences are submitted (its prompt being rendered and tokenized) the runner has nothing running
or queued, and an unload on request or another model's eviction for room took the model from
under it (the request then failed with 503 "the model was unloaded")."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from appliance.api.generation import resolve_runner
from appliance.config import parse_config
from appliance.engine.manager import UNLOAD_SETTLE_S, ModelBusy, ModelManager
from appliance.observability import context
from appliance.resources.cores import CoreBudget
from conftest import SMOLLM2, model_entry

NAME = "smollm2-135m"


async def _taken(manager: ModelManager, info: context.RequestInfo):
    token = context.current.set(info)
    try:
        return await resolve_runner(manager, NAME)
    finally:
        context.current.reset(token)


def test_a_taken_model_is_neither_unloaded_nor_evicted_until_its_request_ends(real_models):
    config = parse_config({"policy": {"strategy": "generic"},
                           "models": [model_entry(NAME, SMOLLM2, n_parallel=1, threads=1)]})
    manager = ModelManager(config, CoreBudget(1))
    manager.start()

    async def scenario() -> None:
        info = context.RequestInfo("held", "POST", "/v1/chat/completions")
        runner = await _taken(manager, info)
        assert runner.state == "ready" and not runner.running() and not runner.queue_depth()
        t0 = time.monotonic()
        with pytest.raises(ModelBusy):  # once the moment it waits for requests that are ending is over
            manager.unload(NAME)
        assert time.monotonic() - t0 >= UNLOAD_SETTLE_S
        assert NAME not in [c.name for c in manager._candidates(manager.budget(NAME), "")]
        info.release_holds()
        info.release_holds()  # a second release changes nothing
        assert NAME in [c.name for c in manager._candidates(manager.budget(NAME), "")]
        manager.unload(NAME)
        assert manager.runners[NAME].state == "unloaded"

        # work a request left running after its end (a background response) takes no hold
        runner = await _taken(manager, info)
        manager.unload(NAME)
        assert manager.runners[NAME].state == "unloaded"

        # a request that ends while an unload waits (its answer was out, its context being saved
        # or its hold not yet released): the unload goes through, not a 409
        ending = context.RequestInfo("ending", "POST", "/v1/chat/completions")
        await _taken(manager, ending)
        threading.Timer(UNLOAD_SETTLE_S / 3, ending.release_holds).start()
        manager.unload(NAME)
        assert manager.runners[NAME].state == "unloaded"

    try:
        asyncio.run(scenario())
    finally:
        manager.stop()


def test_an_unload_asked_while_the_model_loads_unloads_it_once_loaded(real_models):
    # (it answered at once and left the model loading: loaded, and resident, after a 200)
    config = parse_config({"policy": {"strategy": "generic"},
                           "models": [model_entry(NAME, SMOLLM2, n_parallel=1, threads=1)]})
    manager = ModelManager(config, CoreBudget(1))
    manager.start()
    try:
        load = threading.Thread(target=manager.load, args=(NAME,))
        load.start()
        while manager.runners[NAME].state != "loading":
            time.sleep(0.001)
        manager.unload(NAME)
        load.join()
        assert manager.runners[NAME].state == "unloaded"
    finally:
        manager.stop()


def test_under_isolation_the_device_pool_is_what_the_group_pools_leave(real_models):
    # models in no budgeted group had the whole device budget on top of the pools: 583 MiB
    # resident under a 500 MiB budget
    models = [model_entry(n, SMOLLM2, n_parallel=1, threads=1) for n in ("a", "b", "c")]
    config = parse_config({"policy": {"strategy": "generic"}, "models": models,
                           "vram": {"budget_mb": 1000, "group_isolation": True},
                           "groups": [{"name": "ga", "models": ["a"], "budget_mb": 300},
                                      {"name": "gb", "models": ["b"], "budget_mb": 200}]})
    manager = ModelManager(config, CoreBudget(1))
    try:
        assert manager.budget("a").capacity == 300 << 20 and manager.budget("b").capacity == 200 << 20
        assert (manager.budget("c").scope, manager.budget("c").capacity) == ("device", 500 << 20)
    finally:
        manager.stop()
