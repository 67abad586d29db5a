"""Policy engine: strategies decide what is resident; the model manager carries it out."""

from __future__ import annotations

from ..config import Config
from .fixed_appliance import FixedAppliancePolicy


def make_policy(config: Config) -> FixedAppliancePolicy:
    if config.policy.strategy == "fixed-appliance":
        return FixedAppliancePolicy(config)
    raise ValueError(f"policy.strategy: unknown strategy {config.policy.strategy!r}")
