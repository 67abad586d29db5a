"""Which adapter set a runner step decodes (ModelRunner._step_adapters, engine/adapter_turns.py):
sets take turns, the least recently served first, each long enough that the measured switch (the
scheduler's reserve) is a quarter of it, and a lone set never changes the context's adapters."""

from __future__ import annotations

import itertools
from pathlib import Path
from types import SimpleNamespace

import pytest

from appliance.config import ModelConfig
from appliance.engine.adapter_turns import MAX_TURN_S, AdapterTurns
from appliance.engine.adapters import AdapterSwitch
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
    chosen = steps(runner, 9)  # a step a turn until a switch is measured
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


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def run(turns: AdapterTurns, clock: Clock, waiting: set, current, n: int, step_s: float,
        reserve_s: float | None = None) -> list:
    """`n` steps of `step_s`; a step that changes the set first reserves for `reserve_s`."""
    chosen = []
    for _ in range(n):
        before, current = current, turns.choose(waiting, current)
        chosen.append(current)
        clock.now += step_s
        if current != before and reserve_s is not None:  # reported when the decode is over
            clock.now += reserve_s
            turns.switched(reserve_s)
    return chosen


def runs_of(chosen: list) -> list:
    return [(s, len(list(g))) for s, g in itertools.groupby(chosen)]


def test_a_turn_lasts_until_the_switch_is_a_quarter_of_it():
    clock = Clock()
    turns = AdapterTurns(clock)
    turns.switched(0.006)  # a reserve as dear as a 6 ms decode
    assert turns.turn_s == pytest.approx(0.018)
    runs = runs_of(run(turns, clock, {(), A, B}, (), 15, 0.0055, reserve_s=0.006))
    # the decode that switched, then 18 ms of 5.5 ms steps: 5 steps a turn instead of 1
    assert [n for _, n in runs] == [4, 5, 5, 1], runs
    assert {s for s, _ in runs[:3]} == {(), A, B}


def test_until_a_switch_is_measured_sets_change_every_step_and_a_turn_never_passes_its_cap():
    clock = Clock()
    turns = AdapterTurns(clock)
    assert turns.turn_s == 0 and run(turns, clock, {A, B}, A, 4, 0.006) == [A, B, A, B]
    turns.switched(1.0)  # a very dear switch
    assert turns.turn_s == MAX_TURN_S
    runs = runs_of(run(turns, clock, {A, B}, B, 80, 0.010, reserve_s=1.0))
    assert max(n for _, n in runs) == round(MAX_TURN_S / 0.010) + 1 and len(runs) > 2


def test_the_switch_estimate_follows_the_measurements():
    turns = AdapterTurns(Clock())
    turns.switched(0.006)
    for _ in range(40):  # switches got cheap (a GPU, say): turns shrink with them
        turns.switched(0.0005)
    assert turns.switch_s == pytest.approx(0.0005, abs=1e-5) and turns.turn_s == pytest.approx(0.0015, abs=1e-4)


def test_a_set_that_arrives_during_a_lone_run_goes_next():
    clock = Clock()
    turns = AdapterTurns(clock)
    turns.switched(0.006)
    assert run(turns, clock, {A}, A, 100, 0.006) == [A] * 100
    assert turns.choose({A, B}, A) == B


def test_the_reserve_after_a_change_is_timed_and_its_compute_buffer_kept():
    switch = AdapterSwitch([])
    switch.reserve_pending = True
    lines = ["sched_reserve: reserving ...",
             "sched_reserve:        CPU compute buffer size =    14.51 MiB",
             "sched_reserve: graph: nodes = 1386, splits = 1, input objects = 4, input tensors = 6",
             "sched_reserve: reserve took 7.68 ms, sched copies = 1"]
    assert switch.reserved(lines) == pytest.approx(0.00768)
    assert not switch.reserve_pending and switch.compute_peak == int(14.51 * 1024 * 1024)
    assert switch.reserved(["llama_decode: something else"]) is None  # no reserve: nothing learnt
    assert switch.compute_peak == int(14.51 * 1024 * 1024)
    switch.new_context()
    assert switch.compute_peak == 0
