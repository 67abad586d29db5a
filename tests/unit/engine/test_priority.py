"""The order and the rules background (batch) work yields by (engine/priority.py)."""

from __future__ import annotations

from appliance.engine import priority


def test_interactive_first_then_parked_then_background_each_in_arrival_order():
    waiting = ["b1", "f1", "b2", "f2"]
    assert priority.admission_order(waiting, ["p1", "p2"], lambda s: s[0] == "b") == \
        ["f1", "f2", "p1", "p2", "b1", "b2"]


def test_background_leaves_the_last_free_slot():
    assert not priority.may_take_slot(True, 1, 4)
    assert priority.may_take_slot(True, 2, 4)
    assert priority.may_take_slot(True, 1, 1)  # one slot: it runs, and is parked when needed
    assert priority.may_take_slot(False, 1, 4)
    assert not priority.may_take_slot(False, 0, 4)


def test_interactive_requests_do_not_count_background_ones_where_they_yield():
    # one slot, no queue, the slot held by a background sequence
    assert priority.queue_room(False, 0, 1, 1, 0, preempt=True) == 1
    assert priority.queue_room(False, 0, 1, 1, 0, preempt=False) == 0
    assert priority.queue_room(True, 0, 1, 1, 0, preempt=True) == 0


def test_as_few_victims_as_the_starved_need_smallest_state_first():
    sizes = {"a": 300, "b": 10, "c": 50}
    assert priority.victims(2, 0, list(sizes), sizes.get) == ["b", "c"]
    assert priority.victims(2, 1, list(sizes), sizes.get) == ["b"]
    assert priority.victims(1, 1, list(sizes), sizes.get) == []
    assert priority.victims(3, 0, ["a"], sizes.get) == ["a"]
