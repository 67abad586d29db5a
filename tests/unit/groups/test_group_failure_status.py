"""A failed group's HTTP status: the request's own fault (400), its deadline passed for every
member that ran (504 deadline_exceeded, as a single model's request; it was a 502), else the
members' failure (502 group_failed)."""

from __future__ import annotations

from appliance.api.group_routes import failure_body, failure_status
from appliance.groups.executor import GroupResult, MemberResult


def _result(*members: MemberResult) -> GroupResult:
    return GroupResult("g", "parallel", complete=False, members=list(members), failed=True, error="...")


def _member(index: int, status: str, past_deadline: bool = False, attempts: int = 1) -> MemberResult:
    return MemberResult(index, f"m{index}", status=status, attempts=attempts, past_deadline=past_deadline)


def test_every_member_past_the_deadline_is_a_504():
    result = _result(_member(0, "timeout", True), _member(1, "timeout", True), _member(2, "skipped", attempts=0))
    assert failure_status(result) == 504 and failure_body(result).code == "deadline_exceeded"


def test_a_member_that_failed_otherwise_is_a_502():
    for other in (_member(1, "failed"), _member(1, "timeout", False)):  # (its own timeout_ms)
        result = _result(_member(0, "timeout", True), other)
        assert failure_status(result) == 502 and failure_body(result).code == "group_failed"
