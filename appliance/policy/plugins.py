"""Third-party strategies: a shared library with the C ABI of native/include/eie_policy.h, or a
Python class (`plugin:package.module:Class`). Either wraps the generic strategy: what a plugin
does not decide, the generic strategy does. A plugin that cannot be used stops the start-up."""

from __future__ import annotations

import ctypes
import importlib
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from ..config import Config
from ..shared_library import open_library
from .strategies import Candidate, GenericStrategy

log = logging.getLogger("eie.policy")

ABI_VERSION = 1


class PluginError(Exception):
    pass


class _ModelInfo(ctypes.Structure):
    _fields_ = [
        ("name", ctypes.c_char_p),
        ("bytes", ctypes.c_int64),
        ("idle_seconds", ctypes.c_double),
        ("group", ctypes.c_char_p),
    ]


_INIT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p)
_ON_REQUEST = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_char_p)
_ON_PRESSURE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int, ctypes.POINTER(_ModelInfo), ctypes.c_size_t)
_CHOOSE = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_ModelInfo), ctypes.c_size_t, ctypes.c_char_p)
_SHUTDOWN = ctypes.CFUNCTYPE(None)


class _Policy(ctypes.Structure):
    _fields_ = [
        ("abi_version", ctypes.c_uint32),
        ("name", ctypes.c_char_p),
        ("init", _INIT),
        ("on_request", _ON_REQUEST),
        ("on_memory_pressure", _ON_PRESSURE),
        ("choose_eviction", _CHOOSE),
        ("shutdown", _SHUTDOWN),
    ]


class CPluginStrategy(GenericStrategy):
    """A strategy whose decisions come from a shared library."""

    def __init__(self, config: Config, path: str):
        super().__init__(config)
        lib_path = Path(path)
        if not lib_path.is_absolute():
            lib_path = Path(config.source_dir) / lib_path
        try:
            self._lib = open_library(lib_path)
        except OSError as e:
            raise PluginError(f"policy.strategy: cannot load plugin library {lib_path}: {e}") from e
        try:
            get = self._lib.eie_policy_get
        except AttributeError:
            raise PluginError(f"policy.strategy: {lib_path} does not export eie_policy_get") from None
        get.restype = ctypes.POINTER(_Policy)
        ptr = get()
        if not ptr:
            raise PluginError(f"policy.strategy: {lib_path}: eie_policy_get returned NULL")
        self._p = ptr.contents
        if self._p.abi_version != ABI_VERSION:
            raise PluginError(
                f"policy.strategy: {lib_path} has ABI version {self._p.abi_version}; this EIE needs {ABI_VERSION}"
            )
        self.name = f"plugin:{(self._p.name or b'?').decode()}"
        # eie_policy.h promises callbacks one at a time; ctypes lets go of the GIL in them, and
        # loads (one thread each), the janitor and evictions call from threads of their own
        self._one_at_a_time = threading.Lock()
        if self._p.init:
            rc = self._call(self._p.init, json.dumps(config.policy.plugin_options).encode())
            if rc != 0:
                raise PluginError(f"policy.strategy: plugin {self.name} init failed with {rc}")

    def _call(self, fn: Any, *args: Any) -> Any:
        with self._one_at_a_time:
            return fn(*args)

    @staticmethod
    def _infos(candidates: list[Candidate]) -> ctypes.Array:
        now = time.monotonic()
        arr = (_ModelInfo * max(1, len(candidates)))()
        for i, c in enumerate(candidates):
            arr[i].name = c.name.encode()
            arr[i].bytes = c.bytes
            arr[i].idle_seconds = now - c.last_used
            arr[i].group = c.group.encode() if c.group else None
        return arr

    def refuse_load(self, name: str) -> str | None:
        if self._p.on_request and self._call(self._p.on_request, name.encode()) != 0:
            return f"policy {self.name} refused to load {name!r}"
        return super().refuse_load(name)

    def on_memory_pressure(self, level: str, candidates: list[Candidate]) -> int | None:
        if not self._p.on_memory_pressure:
            return super().on_memory_pressure(level, candidates)
        code = {"low": 1, "critical": 2}[level]
        n = self._call(self._p.on_memory_pressure, code, self._infos(candidates), len(candidates))
        return None if n < 0 else n

    def choose_eviction(self, candidates: list[Candidate], for_model: str) -> str | None:
        if not self._p.choose_eviction:
            return super().choose_eviction(candidates, for_model)
        if not candidates:
            return None
        i = self._call(self._p.choose_eviction, self._infos(candidates), len(candidates), for_model.encode())
        return candidates[i].name if 0 <= i < len(candidates) else None

    def close(self) -> None:
        if self._p.shutdown:
            self._call(self._p.shutdown)


class PythonPluginStrategy(GenericStrategy):
    """A strategy whose decisions come from a Python object.

    The class is built as `Class(options: dict)` and may define `refuse_load(name) -> str | None`,
    `choose_eviction(candidates: list[Candidate], for_model: str) -> str | None`,
    `on_memory_pressure(level: str, candidates: list[Candidate]) -> int | None`,
    `keep_alive_s(name) -> float | None` and `close()`.
    """

    def __init__(self, config: Config, spec: str):
        super().__init__(config)
        module_name, _, class_name = spec.partition(":")
        if not class_name:
            raise PluginError(f"policy.strategy: plugin:{spec} must be plugin:<module>:<Class>")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError) as e:
            raise PluginError(f"policy.strategy: cannot import plugin {spec}: {e}") from e
        try:
            self._obj = cls(dict(config.policy.plugin_options))
        except Exception as e:
            raise PluginError(f"policy.strategy: plugin {spec} failed to initialise: {e!r}") from e
        self.name = f"plugin:{spec}"

    def _call(self, method: str, *args, default):
        fn = getattr(self._obj, method, None)
        if fn is None:
            return default()
        try:
            return fn(*args)
        except Exception as e:
            raise PluginError(f"policy plugin {self.name} raised in {method}: {e!r}") from e

    def refuse_load(self, name: str) -> str | None:
        return self._call("refuse_load", name, default=lambda: super(PythonPluginStrategy, self).refuse_load(name))

    def choose_eviction(self, candidates: list[Candidate], for_model: str) -> str | None:
        return self._call("choose_eviction", candidates, for_model,
                          default=lambda: super(PythonPluginStrategy, self).choose_eviction(candidates, for_model))

    def on_memory_pressure(self, level: str, candidates: list[Candidate]) -> int | None:
        return self._call("on_memory_pressure", level, candidates,
                          default=lambda: super(PythonPluginStrategy, self).on_memory_pressure(level, candidates))

    def keep_alive_s(self, name: str) -> float | None:
        return self._call("keep_alive_s", name, default=lambda: super(PythonPluginStrategy, self).keep_alive_s(name))

    def close(self) -> None:
        self._call("close", default=lambda: None)


def load_plugin(config: Config, spec: str) -> GenericStrategy:
    if spec.endswith((".so", ".dylib", ".dll")) or "/" in spec:
        return CPluginStrategy(config, spec)
    return PythonPluginStrategy(config, spec)
