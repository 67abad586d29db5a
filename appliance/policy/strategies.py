"""Residency strategies. A strategy decides; the model manager carries the decisions out.

Every strategy answers the same questions: which models load at boot, whether a model may be
loaded or unloaded now (None: yes; a string: why not), which models are pinned, which idle model
to evict when memory is needed, and how long an idle model stays.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Config


@dataclass(frozen=True)
class Candidate:
    """A resident, idle, evictable model as strategies see it."""

    name: str
    bytes: int
    last_used: float  # time.monotonic() of its last request
    group: str | None


class GenericStrategy:
    """Load on first request, evict the least recently used idle model (Ollama-like)."""

    name = "generic"
    loads_on_demand = True

    def __init__(self, config: Config):
        self.reconfigure(config)

    def reconfigure(self, config: Config) -> None:
        """Take a reloaded config (groups, keep-alive and budgets may have changed)."""
        self.config = config

    def boot_models(self) -> list[str]:
        """Models to load at boot, in load order."""
        return []

    def pinned(self, name: str) -> bool:
        return False

    def refuse_load(self, name: str) -> str | None:
        return None

    def refuse_unload(self, name: str) -> str | None:
        if self.pinned(name):
            return f"policy {self.name}: {name!r} belongs to a pinned group and is never unloaded"
        return None

    def close(self) -> None:
        """Let go of what the strategy holds (a plugin's library or object); nothing here."""

    def keep_alive_s(self, name: str) -> float | None:
        """Idle seconds before unloading; None: never for idleness."""
        if self.pinned(name):
            return None
        ka = self.config.policy.keep_alive_s
        return ka if ka > 0 else None

    def on_memory_pressure(self, level: str, candidates: list[Candidate]) -> int | None:
        """Memory crossed the `level` ("low") watermark: how many of `candidates` to evict at most
        (None: as many as it takes to get back under it)."""
        return None

    def choose_eviction(self, candidates: list[Candidate], for_model: str) -> str | None:
        """The idle model to unload to make room for `for_model`; None: evict nothing."""
        evictable = [c for c in candidates if not self.pinned(c.name)]
        if not evictable:
            return None
        return min(evictable, key=lambda c: c.last_used).name


class PinnedGroupStrategy(GenericStrategy):
    """Pinned groups' models load at boot and are never evicted; other models behave as generic."""

    name = "pinned-group"

    def reconfigure(self, config: Config) -> None:
        super().reconfigure(config)
        self._pinned = {config.base_of(m) for g in config.groups if g.pinned for m in g.models}

    def boot_models(self) -> list[str]:
        return [m.name for m in self.config.models if m.name in self._pinned]

    def pinned(self, name: str) -> bool:
        return name in self._pinned


class MultiGroupStrategy(PinnedGroupStrategy):
    """Several pinned groups, each with its own memory budget; one group never evicts another's models."""

    name = "multi-group"
    isolates_groups = True


class FixedApplianceStrategy(GenericStrategy):
    """Everything loads at boot; nothing is loaded or unloaded later."""

    name = "fixed-appliance"
    loads_on_demand = False

    def boot_models(self) -> list[str]:
        return [m.name for m in self.config.models]

    def pinned(self, name: str) -> bool:
        return True

    def refuse_load(self, name: str) -> str | None:
        return f"policy fixed-appliance loads the fixed model set at boot only; {name!r} cannot be loaded later"

    def refuse_unload(self, name: str) -> str | None:
        return f"policy fixed-appliance never unloads models; {name!r} stays loaded"

    def keep_alive_s(self, name: str) -> float | None:
        return None

    def choose_eviction(self, candidates: list[Candidate], for_model: str) -> str | None:
        return None


BUILTIN = {
    s.name: s for s in (GenericStrategy, PinnedGroupStrategy, MultiGroupStrategy, FixedApplianceStrategy)
}
