"""The model manager: owns the runners and carries out the policy's decisions."""

from __future__ import annotations

import logging
import threading

from ..config import Config
from ..policy import make_policy
from ..resources.cores import CoreBudget
from .runner import ModelRunner

log = logging.getLogger("eie.manager")


class ModelManager:
    def __init__(self, config: Config, cores: CoreBudget | None = None):
        self.config = config
        self.cores = cores or CoreBudget()
        self.policy = make_policy(config)
        self.runners: dict[str, ModelRunner] = {
            m.name: ModelRunner(m, config.model_path(m), self.cores) for m in config.models
        }
        self._boot_thread: threading.Thread | None = None

    def start(self) -> None:
        """Load the boot set in the background, one model at a time; /health reports progress."""
        self._boot_thread = threading.Thread(target=self._boot, name="model-boot", daemon=True)
        self._boot_thread.start()

    def _boot(self) -> None:
        for name in self.policy.boot_models():
            self.runners[name].load()

    def wait_booted(self, timeout: float | None = None) -> bool:
        if self._boot_thread is None:
            return True
        self._boot_thread.join(timeout)
        return not self._boot_thread.is_alive()

    def get(self, name: str) -> ModelRunner | None:
        return self.runners.get(name)

    def states(self) -> dict[str, tuple[str, str | None]]:
        return {name: (r.state, r.error) for name, r in self.runners.items()}

    def stop(self) -> None:
        self.wait_booted(timeout=120)
        for r in self.runners.values():
            r.stop()
