"""How many drafts each sequence verifies in the next step: the count that maximises expected
tokens per second, from each sequence's measured acceptance and the runner's measured cost of a
decode by the number of rows in it.

On a CPU a decode's time grows with its rows almost linearly (SmolLM2 Q4_1 on 2 cores: 2 rows
1.6×, 4 rows 2.7×, 16 rows 7.5× one row), so a draft pays only where it is likely to be accepted.
The j-th draft of a sequence adds the chance that it and the j − 1 before it are accepted
(estimated per source and position, `Acceptance`). A lone sequence verifies the number of drafts
with the most tokens per second, none unless that beats the plain step by `margin`. Several
sequences draft the same number each or none (`_plan_streams`: unequal drafts cost extra passes).
"""

from __future__ import annotations

import collections
import os
import statistics
from dataclasses import dataclass

# EIE_PLAN_SWITCHES=0 plans as if a change of width were free (for A/B runs of bench/speculative.py)
PLAN_SWITCHES = os.environ.get("EIE_PLAN_SWITCHES", "1") != "0"


class StepCost:
    """Wall time of a decode by its number of rows: a line t(n) = a + b·(n − 1) fitted by least
    squares to the runner's decodes (older ones fade by `forget` each), times, for a width seen
    `MIN_ROW_SAMPLES` times or more, the median of its last `ROW_SAMPLES` decodes over what the
    line said for them.

    The cost is not a line: CPU matmul kernels work in tiles of rows, so a decode of 5 rows can
    cost more than one of 8 (SmolLM2 on 2 cores: 4 rows 18 ms, 5 rows 32 ms, 8 rows 31 ms;
    bench/q4_1_rows.py), and a GPU's cost is flat up to some width. The per-width factors let the
    plan pick the widths that are cheap here; a median shrugs off one stalled decode. They are
    kept relative to the line, so when the machine as a whole gets slower or faster (another model
    busy on the cores) the line follows and the shape stays, also for widths the plan then avoids.
    The line's slope is shrunk towards `prior_row_cost`·a as if `prior_weight` decodes one row
    apart had shown it, so a few noisy wide decodes cannot make drafts look dear for good (the
    plan would never try them again), and before any wide decode the prior stands.

    A decode whose width differs from the context's previous decode costs more: llama.cpp
    computes a kept graph of another shape only after allocating it again, and the first
    narrow decode after a wide one is slower still (bench/width_switch.py: ~0.4-0.6 ms of a
    5 ms SmolLM2 step; going wider costs little). `switch_up` and `switch_down` are the medians
    of what recent switched decodes took over their width's expected time; those decodes feed
    the line and the widths less that extra, so the widths keep their steady cost."""

    ROW_SAMPLES = 9
    MIN_ROW_SAMPLES = 3
    # A decode that takes more than this many times its expected time is a stall (the machine
    # paused): it counts towards its width's median, which shrugs it off, but not towards the
    # line, which it would lift, and with it every width's cost, for hundreds of steps. A real
    # slowdown moves the width's median first; the expected time follows, and then the line.
    STALL_FACTOR = 2.0
    SWITCH_SAMPLES = 15

    def __init__(self, prior_row_cost: float = 0.6, forget: float = 0.995, prior_weight: float = 4.0):
        self.prior_row_cost = prior_row_cost
        self.forget = forget
        self.prior_weight = prior_weight
        self._w = self._x = self._y = self._xx = self._xy = 0.0
        self._by_rows: dict[int, collections.deque[float]] = {}  # recent decodes over the line's time
        self._factors: dict[int, float] = {}  # their medians
        self._fitted: tuple[float, float] | None = None  # fit() until the next decode counts (a plan asks ~17 times)
        self._switched = {True: collections.deque(maxlen=self.SWITCH_SAMPLES),  # wider than the previous
                          False: collections.deque(maxlen=self.SWITCH_SAMPLES)}  # narrower
        self.switch_up = self.switch_down = 0.0

    def observe(self, rows: int, seconds: float, previous: int | None = None) -> None:
        """One decode of `rows` rows took `seconds`; `previous`: the width of the decode before
        it on the same context (None: unknown, taken as the same)."""
        if rows <= 0 or seconds <= 0:
            return
        if previous is not None and previous != rows:
            wider = rows > previous
            if rows in self._factors:  # the width's steady time is known: the rest is the switch's
                recent = self._switched[wider]
                recent.append(seconds - self.time(rows))
                if len(recent) >= self.MIN_ROW_SAMPLES:
                    extra = max(0.0, statistics.median(recent))
                    if wider:
                        self.switch_up = extra
                    else:
                        self.switch_down = extra
            seconds = max(seconds - self._switch(previous, rows), 0.5 * seconds)
        line = self._line(rows)
        if line is not None:
            recent = self._by_rows.get(rows)
            if recent is None:
                recent = self._by_rows[rows] = collections.deque(maxlen=self.ROW_SAMPLES)
            recent.append(seconds / line)
            stalled = seconds > self.STALL_FACTOR * line * self._factors.get(rows, 1.0)
            if len(recent) >= self.MIN_ROW_SAMPLES:
                self._factors[rows] = statistics.median(recent)
            if stalled:
                return
        f, x = self.forget, rows - 1
        self._w = self._w * f + 1
        self._x = self._x * f + x
        self._y = self._y * f + seconds
        self._xx = self._xx * f + x * x
        self._xy = self._xy * f + x * seconds
        self._fitted = None

    def fit(self) -> tuple[float, float] | None:
        """(a, b): a one-row decode's seconds and each further row's; None before any decode."""
        if self._fitted is not None:
            return self._fitted
        w = self._w
        if w <= 0:
            return None
        mx, my = self._x / w, self._y / w
        prior_b = self.prior_row_cost * my / (1 + self.prior_row_cost * mx)
        sxx = self._xx - w * mx * mx
        sxy = self._xy - w * mx * my
        b = (sxy + self.prior_weight * prior_b) / (sxx + self.prior_weight)
        a = my - b * mx
        if a <= 0:  # (noise) keep the rows' average cost, from a one-row decode upwards
            b = my / (1 + mx)
            a = b
        self._fitted = (a, max(b, 0.0))
        return self._fitted

    def time(self, rows: int) -> float | None:
        """Expected seconds of a decode with `rows` rows (None before any decode was seen)."""
        line = self._line(rows)
        return None if line is None else line * self._factors.get(rows, 1.0)

    def _switch(self, before: int | None, rows: int) -> float:
        if before is None or before == rows:
            return 0.0
        return self.switch_up if rows > before else self.switch_down

    def switch_time(self, rows: int, base_rows: int, previous: int | None) -> float:
        """The switches a step of `rows` rows commits to, where a plain step has `base_rows`: from
        the previous decode's width (`previous`, None: unknown) to `rows`, and for a step with
        drafts the return to `base_rows` after it (a plain step pays that return now; a step with
        drafts only defers it, so drafts are charged for it and a plain step after drafts is not
        charged twice)."""
        if not PLAN_SWITCHES:
            return 0.0
        extra = self._switch(previous, rows)
        if rows != base_rows:
            extra += self._switch(rows, base_rows)
        return extra

    def _line(self, rows: int) -> float | None:
        ab = self.fit()
        return None if ab is None else ab[0] + ab[1] * (rows - 1)

    def snapshot(self) -> dict:
        """The fitted line, and the expected time of each width measured often enough, in ms."""
        ab = self.fit()
        if ab is None:
            return {}
        return {"one_row_ms": round(ab[0] * 1000, 2), "per_extra_row_ms": round(ab[1] * 1000, 2),
                "measured_ms": {str(n): round(self.time(n) * 1000, 2) for n in sorted(self._factors)},
                "switch_wider_ms": round(self.switch_up * 1000, 2), "switch_narrower_ms": round(self.switch_down * 1000, 2)}


class StepCosts:
    """A `StepCost` per number of sequences in the decode. n rows of one sequence (a token and its
    drafts, one KV stream) and n rows of n sequences (one token each, each its own KV stream) are
    different decodes: in the server on the AMX Xeon, 2 rows took 11.1-12.7 ms as two sequences
    and 6.7 ms as one sequence with a draft (one row 4.5-5.6 ms). Pooled, the two-sequence decodes
    at the end of a 4-stream run set the width-2 cost, the lone plan then avoided a single draft
    as twice as dear as it is, and so never measured that width again (one-stream JSON after
    4-stream runs: 0.96-1.18x; without 4-stream runs before it 1.51x). `previous` is the
    context's last decode width, whatever its sequences (what the plan counts a switch from)."""

    def __init__(self) -> None:
        self._by: dict[int, StepCost] = {}
        self.previous: int | None = None

    def of(self, sequences: int) -> StepCost:
        """The cost model of decodes with this many sequences (made on first use)."""
        cost = self._by.get(sequences)
        if cost is None:
            cost = self._by[sequences] = StepCost()
        return cost

    def observe(self, sequences: int, rows: int, seconds: float, previous: int | None = None) -> None:
        self.of(sequences).observe(rows, seconds, previous)

    def snapshot(self) -> dict:
        """Each sequence count's `StepCost.snapshot()`."""
        return {str(n): cost.snapshot() for n, cost in sorted(self._by.items())}


class Acceptance:
    """How far one source's drafts run before the first wrong token, per draft position: position
    j was reached `reach[j]` times and held the first wrong token `fail[j]` times (older
    observations fade by `decay` each). Acceptance is not the same at every position: a
    rewrite copies long runs, and a draft that got far is likelier to go on."""

    __slots__ = ("reach", "fail", "decay", "version")

    def __init__(self, positions: int, decay: float):
        self.reach = [0.0] * (positions + 1)  # index 0 unused
        self.fail = [0.0] * (positions + 1)
        self.decay = decay
        self.version = 0  # counts changes (what is derived from the counts is cached by it)

    def update(self, drafted: int, accepted: int, credited: int = 0) -> None:
        """One draft of `drafted` tokens whose first `accepted` were right; its first `credited`
        positions were counted already (`credit`)."""
        if drafted <= 0:
            return
        self.version += 1
        d, reach, fail = self.decay, self.reach, self.fail
        for j in range(1, len(reach)):
            reach[j] *= d
            fail[j] *= d
        for j in range(credited + 1, min(accepted + 1, drafted, len(reach) - 1) + 1):
            reach[j] += 1
        if accepted < drafted and accepted + 1 < len(reach):
            fail[accepted + 1] += 1

    def credit(self, done: int, passed: int) -> None:
        """Positions done+1..passed of a draft still being scored were right. Counted as they
        pass, not when the draft's run ends: otherwise the estimate at any moment would hold the
        short runs (decided at once) and miss the long ones in progress, the censoring that
        makes a source look worst exactly while it is copying a long stretch."""
        reach = self.reach
        self.version += 1
        for j in range(done + 1, min(passed, len(reach) - 1) + 1):
            reach[j] += 1

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


def plan(base_rows: int, candidates: list[Candidate], cost: StepCost, previous: int | None = None,
         margin: float = 0.02) -> list[int]:
    """Drafts per candidate for a step whose plain decode has `base_rows` rows (one per decoding
    sequence), after a decode of `previous` rows (None: unknown): the count with the most expected
    tokens per second, 0 where none pays."""
    counts = [0] * len(candidates)
    t0 = cost.time(base_rows)
    if t0 is None or not candidates:
        return counts
    t0 += cost.switch_time(base_rows, base_rows, previous)
    if base_rows > 1:
        return _plan_streams(base_rows, candidates, cost, previous, t0, margin)
    gains = []  # (gain, seq index, draft cost); a sequence's gains never grow with position
    for i, c in enumerate(candidates):
        gains += [(g, i, c.draft_cost) for g in c.gains if g >= 1e-3]
    gains.sort(key=lambda x: -x[0])
    best_rate, best_m = base_rows / t0 * (1 + margin), 0
    tokens, drafting = float(base_rows), 0.0
    for m, (g, _, dc) in enumerate(gains, start=1):
        tokens += g
        drafting += dc
        t = cost.time(base_rows + m) + cost.switch_time(base_rows + m, base_rows, previous)
        rate = tokens / (t + drafting)
        if rate > best_rate:
            best_rate, best_m = rate, m
    for _, i, _ in gains[:best_m]:
        counts[i] += 1
    return counts


def _plan_streams(base_rows: int, candidates: list[Candidate], cost: StepCost, previous: int | None, t0: float,
                  margin: float) -> list[int]:
    """Several sequences: llama.cpp splits a batch over several KV streams into ubatches with the
    same number of tokens of every sequence in them (and consecutive sequence ids), so unequal
    drafts cost whole extra passes over the weights: rows 7, 1, 1, 1 take a pass of 4 rows and
    one of 6. The plan drafts only when every decoding sequence has a draft, the same number
    for each (at most the shortest), one pass: the number with the most expected tokens per second."""
    if len(candidates) < base_rows:
        return [0] * len(candidates)
    best_rate, best_k = base_rows / t0 * (1 + margin), 0
    for k in range(1, min(len(c.gains) for c in candidates) + 1):
        tokens = base_rows + sum(sum(c.gains[:k]) for c in candidates)
        drafting = sum(c.draft_cost * k for c in candidates)
        rows = base_rows * (1 + k)
        rate = tokens / (cost.time(rows) + cost.switch_time(rows, base_rows, previous) + drafting)
        if rate > best_rate:
            best_rate, best_k = rate, k
    return [best_k] * len(candidates)
