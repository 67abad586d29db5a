"""Which LoRA adapter set a runner step decodes, and for how long a set keeps the context.

llama.cpp applies adapters to a whole context, so the sets waiting take turns. A change of set
makes llama.cpp reserve its scheduler at the next decode (a new scheduler, its compute buffers
allocated again), which costs about a decode on the CPU (SmolLM2 on 2 cores: 5.9 ms a token,
11.4-12.0 ms right after a change). Changing at every step would pay that at every step; so a set
keeps the context for a turn long enough that the switch is a small share of it
(`SWITCH_SHARE`), measured by llama.cpp's own report of the reserve. Until one is measured a
turn is one step, and a turn never runs past `MAX_TURN_S`, so a stream of another set waits at
most about one turn per set ahead of it. Sets take turns least recently served first.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from .adapters import AdapterSet

# the share of a turn the switch may take (the reserve at its first decode); EIE_ADAPTER_TURNS=0
# changes sets at every step, as before turns (bench/lora_adapters.py's A/B)
SWITCH_SHARE = 0.25 if os.environ.get("EIE_ADAPTER_TURNS", "1") != "0" else 1.0
MAX_TURN_S = 0.25  # the longest a set keeps the context while others wait
_EMA = 0.2  # weight of a new measurement in the running estimate


class AdapterTurns:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._served: dict[AdapterSet, int] = {}  # set -> the last step that decoded it
        self._step_no = 0
        self._turn_start = float("-inf")  # when the context's set got it (its reserve done)
        self.switch_s: float | None = None  # what a change costs: the reserve after it

    @property
    def turn_s(self) -> float:
        """How long a set keeps the context after the decode that switched to it, while others
        wait (0 until a switch is measured): switch / (switch + turn) is SWITCH_SHARE."""
        if self.switch_s is None:
            return 0.0
        return min(MAX_TURN_S, self.switch_s * (1 - SWITCH_SHARE) / SWITCH_SHARE)

    def choose(self, waiting: set[AdapterSet], current: AdapterSet) -> AdapterSet:
        """The set this step decodes, of those with sequences `waiting`; `current` is the
        context's. A lone set never changes the context."""
        if not waiting:
            return current
        now = self._clock()
        served = self._served
        if len(waiting) == 1:
            (chosen,) = waiting
        elif current in waiting and now - self._turn_start < self.turn_s:
            chosen = current  # its turn goes on
        else:
            chosen = min(waiting, key=lambda a: (served.get(a, -1), a != current))
        if chosen != current:
            self._turn_start = now
        self._step_no += 1
        self._served = {a: served.get(a, -1) for a in waiting}
        self._served[chosen] = self._step_no
        return chosen

    def switched(self, reserve_s: float) -> None:
        """A change of set made llama.cpp reserve its scheduler, which took `reserve_s`: the
        decode that did is over, and the set's turn counts from now."""
        self._turn_start = self._clock()
        self.switch_s = reserve_s if self.switch_s is None else self.switch_s + _EMA * (reserve_s - self.switch_s)
