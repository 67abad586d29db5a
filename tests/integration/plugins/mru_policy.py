"""A Python policy plugin for the tests: evicts the most recently used idle model and refuses
to load models whose name starts with the configured prefix."""

from __future__ import annotations


class MostRecentFirst:
    def __init__(self, options: dict):
        if options.get("explode"):
            raise RuntimeError("plugin init exploded on purpose")
        self.refuse_prefix = options.get("refuse_prefix", "")
        self.options = options

    def refuse_load(self, name: str) -> str | None:
        if self.refuse_prefix and name.startswith(self.refuse_prefix):
            return f"MostRecentFirst refuses models named {self.refuse_prefix}*"
        return None

    def choose_eviction(self, candidates, for_model: str) -> str | None:
        if not candidates:
            return None
        return max(candidates, key=lambda c: c.last_used).name


class NeverUnderPressure(MostRecentFirst):
    """Lets memory stay above the low watermark: evicts nothing on pressure."""

    def on_memory_pressure(self, level: str, candidates) -> int | None:
        return 0


class RaisesOnRequest(MostRecentFirst):
    def refuse_load(self, name: str) -> str | None:
        raise ValueError("plugin bug")


class Wayward(MostRecentFirst):
    """Raises in refuse_load for models named `raise_for`, and names `evict` (a model that is not
    among the candidates) as every eviction."""

    def refuse_load(self, name: str) -> str | None:
        if name == self.options["raise_for"]:
            raise RuntimeError(f"plugin bug loading {name}")
        return None

    def choose_eviction(self, candidates, for_model: str) -> str | None:
        return self.options["evict"]
