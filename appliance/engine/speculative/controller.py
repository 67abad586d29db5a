"""Self-regulation, per model: a switch that keeps speculation on only where it pays (the draft
lengths themselves come from planner.py).

`Controller` compares the time per emitted token of steps with speculation on (the speculative
path ran: lookups, plan, and drafts verified where the plan chose some) with steps with it off,
measured on the same runner at the same number of decoding sequences (a batched runner pays for
drafts differently than a lone stream). A step whose plan declined every draft counts as one
with speculation on: it paid for the lookups and the plan (0.06 ms of a 5 ms SmolLM2 step per
sequence), and where nothing repeats (stories) that is most of what speculation costs; counted
as plain, as it was until 2026-12-01, it hid that cost in the baseline (SmolLM2's stories with 4
streams, where the plan drafted 19 tokens in 640: 0.94× of plain decoding). Such a step is also a
plain step plus the lookups: its time less theirs is a sample of the baseline. While speculation
is on, a step runs without it when the baseline has had no sample for `probe_every` steps (a step
that could have verified drafts, lost where drafts pay: in a copying answer the plan declines
now and then, and those steps keep the baseline current instead); while it is off, a
burst of `probe_steps` steps with it is tried after `reprobe_after` steps, a wait that doubles
after each failed probe (up to `max_reprobe`) and resets after a success, and that is cut short
when a new request comes (it may be another workload: a repeated request, which copies an
earlier answer, would otherwise wait out a wait grown over requests whose drafts did not pay; a
sequence whose drafts lose is stopped by the speculator's guard).

It judges on the last `window` steps of each kind, and not before `min_samples` of each: the
planner already declines drafts that its estimates say do not pay, so the controller is the
safety net for a wrong cost model, not a second regulator of local acceptance. Judged on a
short window it switched speculation off in a hard stretch of an answer (a JSON's invented
values) and then missed the copyable stretches after it (replayed over SmolLM2's JSON answers
with a fixed cost by width: 1.35× with a window of 24, 1.52× with 64, 1.51× without the
controller).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass


class _Window:
    """The last `size` steps' (seconds, tokens) and their totals, kept as they come (the rate
    is read at every step: summing the window each time was most of the controller's cost)."""

    __slots__ = ("items", "size", "seconds", "tokens", "_popped")

    def __init__(self, size: int):
        self.items: collections.deque[tuple[float, int]] = collections.deque()
        self.size = size
        self.seconds = 0.0
        self.tokens = 0
        self._popped = 0

    def __len__(self) -> int:
        return len(self.items)

    def append(self, seconds: float, tokens: int) -> None:
        self.items.append((seconds, tokens))
        self.seconds += seconds
        self.tokens += tokens
        if len(self.items) > self.size:
            s, t = self.items.popleft()
            self.tokens -= t
            self._popped += 1
            if self._popped >= self.size:  # now and then from scratch: no drift of the float total
                self._popped = 0
                self.seconds = sum(x for x, _ in self.items)
            else:
                self.seconds -= s

    def clear(self) -> None:
        self.items.clear()
        self.seconds, self.tokens, self._popped = 0.0, 0, 0

    def rate(self) -> float:
        """Tokens per second over the window (0 when empty)."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class _Arm:
    """Measurements at one batch size: recent (seconds, tokens) of each kind of step (windows of
    the controller's `window`)."""

    spec: _Window
    plain: _Window
    on: bool = True
    since_plain: int = 0  # steps since the baseline's last sample
    probing: int = 0  # steps with speculation on still to see in the current probe (while off)
    wait: int = 0  # steps until the next probe (while off)
    backoff: int = 0


class Controller:
    def __init__(self, probe_every: int = 16, probe_steps: int = 16, reprobe_after: int = 64,
                 max_reprobe: int = 2048, min_samples: int = 16, margin: float = 0.03, window: int = 64):
        self.probe_every = probe_every
        self.probe_steps = probe_steps
        self.reprobe_after = reprobe_after
        self.max_reprobe = max_reprobe
        self.min_samples = min_samples
        self.margin = margin
        self.window = window
        self._arms: dict[int, _Arm] = {}
        self.last_batch = 1
        self.switches_off = 0
        self.switches_on = 0

    def _arm(self, batch: int) -> _Arm:
        arm = self._arms.get(batch)
        if arm is None:
            arm = self._arms[batch] = _Arm(_Window(self.window), _Window(self.window), backoff=self.reprobe_after)
        return arm

    def speculate(self, batch: int) -> bool:
        """Whether the next step with `batch` decoding sequences should draft."""
        self.last_batch = batch
        arm = self._arm(batch)
        arm.since_plain += 1
        if arm.on:
            # the baseline: a plain step when it has had no sample for probe_every steps (4 until
            # there are enough)
            every = self.probe_every if len(arm.plain) >= self.min_samples else 4
            return arm.since_plain < every
        if arm.probing > 0:
            return True
        arm.wait -= 1
        if arm.wait <= 0:
            arm.probing = self.probe_steps
            arm.spec.clear()  # judge the probe on fresh measurements
            return True
        return False

    def record(self, batch: int, speculated: bool, seconds: float, tokens: int,
               plain_seconds: float | None = None) -> None:
        """One step's wall time (the speculative path, decode and verification) and the tokens it
        emitted; `speculated`: speculation was on for it (`speculate` said so), drafts or not;
        `plain_seconds`: for such a step that verified no drafts, its time without the speculative
        path's (a sample of the baseline too)."""
        if tokens <= 0 or seconds <= 0:
            return
        arm = self._arm(batch)
        (arm.spec if speculated else arm.plain).append(seconds, tokens)
        if not speculated:
            arm.since_plain = 0
        elif plain_seconds is not None and plain_seconds > 0:
            arm.plain.append(plain_seconds, tokens)
            arm.since_plain = 0
        if arm.on:
            if len(arm.spec) < self.min_samples or len(arm.plain) < self.min_samples:
                return
            if arm.spec.rate() < arm.plain.rate() * (1 - self.margin):
                arm.on = False
                arm.wait = arm.backoff
                arm.backoff = min(self.max_reprobe, arm.backoff * 2)
                self.switches_off += 1
        elif arm.probing > 0 and speculated:
            arm.probing -= 1
            if arm.probing > 0 or len(arm.plain) < self.min_samples:
                return
            if arm.spec.rate() > arm.plain.rate() * (1 + self.margin):
                arm.on = True
                arm.backoff = self.reprobe_after
                self.switches_on += 1
            else:
                arm.wait = arm.backoff
                arm.backoff = min(self.max_reprobe, arm.backoff * 2)

    def new_request(self) -> None:
        """A request starts speculating: an arm that is off and waiting probes at its next step."""
        for arm in self._arms.values():
            if not arm.on and arm.probing <= 0:
                arm.wait = min(arm.wait, 1)

    def plain_rate(self, batch: int) -> float:
        """Tokens per second of the recent plain steps at this batch size (0 before min_samples)."""
        arm = self._arms.get(batch)
        return arm.plain.rate() if arm is not None and len(arm.plain) >= self.min_samples else 0.0

    @property
    def on(self) -> bool:
        """Whether speculation is on at the batch size seen last."""
        arm = self._arms.get(self.last_batch)
        return True if arm is None else arm.on

    def snapshot(self) -> dict:
        return {
            "on": self.on,
            "by_batch": {
                str(b): {"on": a.on, "probing": not a.on and a.probing > 0,
                         "spec_tok_s": round(a.spec.rate(), 2), "plain_tok_s": round(a.plain.rate(), 2)}
                for b, a in sorted(self._arms.items())
            },
            "switches_off": self.switches_off,
            "switches_on": self.switches_on,
        }
