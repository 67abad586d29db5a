"""fixed-appliance: every configured model is loaded at boot; nothing is loaded or unloaded later."""

from __future__ import annotations

from ..config import Config


class FixedAppliancePolicy:
    name = "fixed-appliance"

    def __init__(self, config: Config):
        self.config = config

    def boot_models(self) -> list[str]:
        """Models to load at boot, in load order."""
        return [m.name for m in self.config.models]

    def refuse_load(self, name: str) -> str | None:
        """Why a load after boot is refused (None would allow it)."""
        return f"policy fixed-appliance loads the fixed model set at boot only; {name!r} cannot be loaded later"

    def refuse_unload(self, name: str) -> str | None:
        return f"policy fixed-appliance never unloads models; {name!r} stays loaded"
