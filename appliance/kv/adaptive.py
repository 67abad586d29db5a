"""Adaptive KV: when to move a model's KV cache one rung down the ladder, and back up.

Pure decisions; the model manager feeds in what it measured on each janitor pass and carries
out the returned change with `ModelRunner.change_kv_types` (a live migration, no reload).

- Down, one rung, when the memory in use crosses the budget's low watermark (the adaptive model
  holding the most KV goes first), or when a model's recent decode latency exceeds its
  configured bound. One change per pass, and a model changes at most once per `cooldown_s`.
- Up, one rung toward the type the model started with (never above it), once the pressure has
  been gone for `upgrade_after_s` and the larger KV would still leave `margin` of the budget
  below the low watermark: the hysteresis that keeps a model from flapping at the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..resources.kv_choice import fmt_bytes, kv_label

Rung = tuple[str, str]  # (type_k, type_v)


@dataclass(frozen=True)
class ModelKv:
    name: str
    rungs: list[Rung]  # the model's ladder from its starting type down, least compressed first
    current: Rung
    kv_bytes: list[int]  # KV bytes at each rung
    decode_ms: float | None = None  # recent median time per decode step, if measured
    max_decode_ms: float | None = None  # the configured latency bound


@dataclass(frozen=True)
class Pressure:
    used: int  # bytes in use in the budget (models and, for RAM, everything else)
    capacity: int
    low: int  # the low watermark, bytes
    scope: str  # "device" | "RAM" …


@dataclass(frozen=True)
class Change:
    model: str
    to: Rung
    reason: str
    direction: str  # "down" | "up"


@dataclass
class Controller:
    cooldown_s: float = 10.0
    upgrade_after_s: float = 30.0
    margin: float = 0.05  # of capacity, kept free below the low watermark before going up
    _last_change: dict[str, float] = field(default_factory=dict)
    _calm_since: float | None = None

    def decide(self, models: list[ModelKv], pressure: Pressure | None, now: float) -> Change | None:
        ready = [m for m in models if now - self._last_change.get(m.name, -1e18) >= self.cooldown_s]
        slow = [m for m in ready if m.max_decode_ms and m.decode_ms and m.decode_ms > m.max_decode_ms
                and _index(m) < len(m.rungs) - 1]
        over = pressure is not None and pressure.used > pressure.low
        if over or slow:
            self._calm_since = None
        if over:
            lower = [m for m in ready if _index(m) < len(m.rungs) - 1]
            if lower:
                m = max(lower, key=lambda m: m.kv_bytes[_index(m)])
                pct = 100 * pressure.low / pressure.capacity
                return self._change(m, +1, now, (
                    f"memory: {fmt_bytes(pressure.used)} in use in the {pressure.scope} budget of "
                    f"{fmt_bytes(pressure.capacity)}, above its {pct:g}% low watermark"))
        if slow:
            m = slow[0]
            return self._change(m, +1, now, f"decode latency {m.decode_ms:.1f} ms per step, above the "
                                             f"{m.max_decode_ms:g} ms bound")
        if over:
            return None
        if self._calm_since is None:
            self._calm_since = now
        if now - self._calm_since < self.upgrade_after_s:
            return None
        for m in ready:
            i = _index(m)
            if i == 0:
                continue
            if m.max_decode_ms and m.decode_ms and m.decode_ms > 0.8 * m.max_decode_ms:
                continue  # latency still close to its bound
            if pressure is not None:
                grown = pressure.used + m.kv_bytes[i - 1] - m.kv_bytes[i]
                if grown > pressure.low - self.margin * pressure.capacity:
                    continue
            return self._change(m, -1, now, (
                f"pressure gone for {now - self._calm_since:.0f}s and {kv_label(*m.rungs[i - 1])} fits "
                "below the low watermark with margin"))
        return None

    def _change(self, m: ModelKv, step: int, now: float, reason: str) -> Change:
        self._last_change[m.name] = now
        if step < 0:
            self._calm_since = now  # the next step up waits its turn again
        to = m.rungs[_index(m) + step]
        return Change(m.name, to, reason, "down" if step > 0 else "up")


def _index(m: ModelKv) -> int:
    try:
        return m.rungs.index(m.current)
    except ValueError:
        return 0
