"""Policy engine: strategies decide what is resident; the model manager carries it out."""

from __future__ import annotations

from ..config import Config
from .plugins import PluginError, load_plugin
from .strategies import BUILTIN, Candidate, GenericStrategy

__all__ = ["Candidate", "GenericStrategy", "PluginError", "make_policy"]


def make_policy(config: Config) -> GenericStrategy:
    """The configured strategy; raises PluginError when a plugin cannot be used."""
    strategy = config.policy.strategy
    if strategy.startswith("plugin:"):
        return load_plugin(config, strategy[len("plugin:") :])
    return BUILTIN[strategy](config)
