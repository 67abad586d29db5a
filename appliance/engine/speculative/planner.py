"""How many drafts each sequence verifies in the next step: the count that maximises expected
tokens per second, from each sequence's measured acceptance and the runner's measured cost of a
decode by the number of rows in it.

On a CPU a decode's time grows with its rows almost linearly (SmolLM2 Q4_1 on 2 cores: 2 rows
1.6×, 4 rows 2.7×, 16 rows 7.5× one row), so a draft pays only where it is likely to be accepted.
The j-th draft of a sequence adds the chance that it and the j − 1 before it are accepted
(estimated per source and position, `Acceptance`). Sorting every candidate draft of the step by
that gain, the best set of m rows is the first m; the plan takes the m with the most tokens per
second, and none unless that beats the plain step by `margin`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


class StepCost:
    """Wall time of a decode by its number of rows, learned from the runner's own decodes
    (exponential average per row count; linear in between; a prior slope beyond)."""

    def __init__(self, prior_row_cost: float = 0.6, alpha: float = 0.25):
        self.prior_row_cost = prior_row_cost  # an extra row's cost over a one-row decode, before it is measured
        self.alpha = alpha
        self._rows: list[int] = []
        self._time: dict[int, float] = {}

    def observe(self, rows: int, seconds: float) -> None:
        if rows <= 0 or seconds <= 0:
            return
        old = self._time.get(rows)
        if old is None:
            bisect.insort(self._rows, rows)
            self._time[rows] = seconds
        else:
            self._time[rows] = old + self.alpha * (seconds - old)

    def time(self, rows: int) -> float | None:
        """Expected seconds of a decode with `rows` rows (None before any decode was seen)."""
        known = self._rows
        if not known:
            return None
        t = self._time.get(rows)
        if t is not None:
            return t
        i = bisect.bisect_left(known, rows)
        if 0 < i < len(known):  # between two measured sizes
            lo, hi = known[i - 1], known[i]
            w = (rows - lo) / (hi - lo)
            return self._time[lo] * (1 - w) + self._time[hi] * w
        if i == 0:  # below the smallest measured size: scale it down by the prior slope
            hi = known[0]
            per_row = self._time[hi] * self.prior_row_cost / (1 + self.prior_row_cost * (hi - 1))
            return max(self._time[hi] - per_row * (hi - rows), per_row)
        top = known[-1]
        if len(known) >= 2:  # beyond: the slope of the two largest sizes, at least the prior's
            prev = known[-2]
            slope = (self._time[top] - self._time[prev]) / (top - prev)
        else:
            slope = 0.0
        prior = self._time[known[0]] * self.prior_row_cost / (1 + self.prior_row_cost * (known[0] - 1))
        return self._time[top] + max(slope, prior) * (rows - top)

    def snapshot(self) -> dict[str, float]:
        return {str(r): round(self._time[r] * 1000, 2) for r in self._rows}


class Acceptance:
    """How far one source's drafts run before the first wrong token, per draft position: position
    j was reached `reach[j]` times and held the first wrong token `fail[j]` times (older
    observations fade by `decay` each). Acceptance is not the same at every position: a
    rewrite copies long runs, and a draft that got far is likelier to go on."""

    __slots__ = ("reach", "fail", "decay")

    def __init__(self, positions: int, decay: float):
        self.reach = [0.0] * (positions + 1)  # index 0 unused
        self.fail = [0.0] * (positions + 1)
        self.decay = decay

    def update(self, drafted: int, accepted: int) -> None:
        """One draft of `drafted` tokens whose first `accepted` were right."""
        if drafted <= 0:
            return
        d, reach, fail = self.decay, self.reach, self.fail
        for j in range(1, len(reach)):
            reach[j] *= d
            fail[j] *= d
        for j in range(1, min(accepted + 1, drafted, len(reach) - 1) + 1):
            reach[j] += 1
        if accepted < drafted and accepted + 1 < len(reach):
            fail[accepted + 1] += 1

    def hazards(self, prior: list[float], weight: float) -> list[float]:
        """Per position, the chance a draft that got there is wrong there; `weight` observations
        of `prior` (per position) mixed in."""
        return [(f + weight * p) / (r + weight) if r + weight > 0 else p for f, r, p in zip(self.fail, self.reach, prior)]

    @property
    def trials(self) -> float:
        return self.reach[1]


def survival(hazards: list[float], n: int) -> list[float]:
    """The chance that each of the first n drafts is accepted (all before it too)."""
    out, s = [], 1.0
    for h in hazards[1 : n + 1]:
        s *= 1.0 - h
        out.append(s)
    return out


@dataclass(frozen=True)
class Candidate:
    gains: list[float]  # expected tokens each further draft adds (its chance of acceptance)
    draft_cost: float = 0.0  # seconds to produce each draft (a draft model); 0 for lookups


def plan(base_rows: int, candidates: list[Candidate], cost: StepCost, margin: float = 0.02) -> list[int]:
    """Drafts per candidate for a step whose plain decode has `base_rows` rows (one per decoding
    sequence): the count with the most expected tokens per second, 0 where none pays."""
    counts = [0] * len(candidates)
    t0 = cost.time(base_rows)
    if t0 is None or not candidates:
        return counts
    gains = []  # (gain, seq index, draft cost); a sequence's gains never grow with position
    for i, c in enumerate(candidates):
        gains += [(g, i, c.draft_cost) for g in c.gains if g >= 1e-3]
    gains.sort(key=lambda x: -x[0])
    best_rate, best_m = base_rows / t0 * (1 + margin), 0
    tokens, drafting = float(base_rows), 0.0
    for m, (g, _, dc) in enumerate(gains, start=1):
        tokens += g
        drafting += dc
        t = cost.time(base_rows + m)
        rate = tokens / (t + drafting)
        if rate > best_rate:
            best_rate, best_m = rate, m
    for _, i, _ in gains[:best_m]:
        counts[i] += 1
    return counts
