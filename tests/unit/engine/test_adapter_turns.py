"""Which adapter set a runner step decodes (ModelRunner._step_adapters): sets take turns, the
least recently served first, and a lone set never changes the context's adapters."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from appliance.config import ModelConfig
from appliance.engine.runner import ModelRunner
from appliance.resources.cores import CoreBudget

A, B = ((0, 1.0),), ((1, 0.5),)


def runner_with(*sets) -> ModelRunner:
    runner = ModelRunner(ModelConfig(name="m", path="m.gguf"), Path("m.gguf"), CoreBudget(1))
    runner._active = [SimpleNamespace(req=SimpleNamespace(adapters=s)) for s in sets]
    return runner


def steps(runner: ModelRunner, n: int) -> list:
    chosen = []
    for _ in range(n):
        c = runner._step_adapters()
        runner._switch.current = c  # what the step's decode sets
        chosen.append(c)
    return chosen


def test_sets_take_turns_in_a_fixed_order():
    runner = runner_with((), A, (), B)
    chosen = steps(runner, 9)
    assert chosen[:3] == chosen[3:6] == chosen[6:9]
    assert set(chosen[:3]) == {(), A, B}
    assert chosen[0] == ()  # the context's current set goes first


def test_a_lone_set_keeps_the_context_as_it_is():
    runner = runner_with(A, A)
    assert steps(runner, 4) == [A] * 4
    runner._active = []
    assert steps(runner, 1) == [A]  # nothing to run: no change either


def test_a_set_that_arrives_waits_at_most_one_round():
    runner = runner_with((), A)
    steps(runner, 3)
    runner._active.append(SimpleNamespace(req=SimpleNamespace(adapters=B)))
    assert B in steps(runner, 2)
