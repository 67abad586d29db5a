"""Shared fixtures: real GGUF models from `make setup`, real `eie serve` processes."""

from __future__ import annotations

import ast
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def build_spec_host_libs() -> re.Pattern[str]:
    """build.spec's HOST_LIBS: the libraries the frozen bundle leaves to the host."""
    for node in ast.parse((ROOT / "build.spec").read_text()).body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "HOST_LIBS":
            return re.compile(ast.literal_eval(node.value.args[0]))
    raise AssertionError("build.spec has no HOST_LIBS")


MODELS = ROOT / "models"
SMOLLM2 = MODELS / "SmolLM2-135M-Instruct.Q4_1.gguf"
GEMMA3 = MODELS / "gemma-3-270m-q4_k_m.gguf"
EIE = Path(sys.executable).parent / "eie"


# Tests check what the server answers, not how fast: httpx's default of 5 s turned one stall of
# this 2-core VM (an admin GET that took 6.8 s once in a full run, 25 ms alone) into a failure.
# Calls that pass their own timeout keep it.
HTTP_TIMEOUT_S = 30.0


@pytest.fixture(scope="session", autouse=True)
def patient_http() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        for name in ("get", "post", "put", "delete", "request", "stream"):
            def patient(*args: Any, _call: Any = getattr(httpx, name), **kwargs: Any) -> Any:
                kwargs.setdefault("timeout", HTTP_TIMEOUT_S)
                return _call(*args, **kwargs)
            mp.setattr(httpx, name, patient)
        yield


def share_file_facts(cache_dir: Path, facts: Path) -> None:
    """Point the facts a server keeps about model files (hashes, GGUF dimensions, K means, the
    exactness probe's answer: resources/file_facts.py) at `facts`, shared by every server of the
    session, as they are by every start of an appliance; the rest of its cache dir (the prefix
    cache's disk tier) stays its own. Measured afresh, they cost each server 5-8 s on 2 cores; a
    test of how they are measured gives its server a cache_dir of its own."""
    from appliance.resources import file_facts

    cache_dir.mkdir(parents=True, exist_ok=True)
    for kind in file_facts.KINDS:
        (facts / kind).mkdir(parents=True, exist_ok=True)
        (cache_dir / kind).symlink_to(facts / kind, target_is_directory=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """An `eie serve` process on a free loopback port."""

    def __init__(self, config: dict[str, Any], workdir: Path, name: str = "server", env: dict[str, str] | None = None,
                 facts: Path | None = None):
        self.env = {**os.environ, **(env or {})}
        self.port = free_port()
        self.config_path = workdir / f"{name}.yaml"
        cache = workdir / f"{name}-cache"
        if facts is not None and "cache_dir" not in config.get("server", {}):
            share_file_facts(cache, facts)
        server = {"state_dir": str(workdir / f"{name}-state"), "cache_dir": str(cache),
                  **config.get("server", {}),
                  "host": "127.0.0.1", "port": self.port}
        config = {**config, "server": server}
        self.config_path.write_text(yaml.safe_dump(config))
        self.log_path = workdir / f"{name}.log"
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.shared = False  # used by more than one test module (server_factory stops it last)

    def start(self) -> "Server":
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [str(EIE), "serve", "--config", str(self.config_path)], stdout=self._log, stderr=subprocess.STDOUT,
            env=self.env,
        )
        return self

    def wait_up(self, timeout: float = 60) -> None:
        """Until the HTTP port answers (models may still be loading)."""
        self._wait(lambda r: True, timeout)

    def wait_settled(self, timeout: float = 120) -> dict:
        """Until no model is still loading; returns the /health body."""
        return self._wait(lambda r: r.json()["status"] != "loading", timeout)

    def _wait(self, done, timeout: float) -> dict:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                r = httpx.get(self.base + "/health", timeout=2)
                if done(r):
                    return r.json()
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready in {timeout}s:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-5000:]

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self._log.close()


def model_entry(name: str, path: Path, **kw: Any) -> dict[str, Any]:
    return {"name": name, "path": str(path), "n_ctx": 2048, "n_parallel": 2, "threads": os.cpu_count() or 2, **kw}


@pytest.fixture(scope="session")
def real_models() -> None:
    missing = [str(p) for p in (SMOLLM2, GEMMA3) if not p.is_file()]
    if missing:
        pytest.fail(f"models missing (run `make setup`): {missing}")


@pytest.fixture(scope="session")
def smollm2_vocab(real_models) -> Iterator[Any]:
    """SmolLM2's vocabulary alone (no weights), as engine.native.Vocab: for grammars and tokens."""
    import llama_cpp as lc

    from appliance.engine import native

    native.init_backend()
    params = lc.llama_model_default_params()
    params.vocab_only = True
    model = lc.llama_model_load_from_file(str(SMOLLM2).encode(), params)
    assert model
    v = lc.llama_model_get_vocab(model)
    yield native.Vocab(v, lc.llama_vocab_n_tokens(v))
    lc.llama_model_free(model)


# Every server the session started, in order.
_STARTED: list[Server] = []


def stop_all(servers: list[Server]) -> None:
    """SIGTERM to each, then wait for each (their shutdowns overlap)."""
    for s in servers:
        if s.proc and s.proc.poll() is None:
            s.proc.send_signal(signal.SIGTERM)
    for s in servers:
        s.stop()


@pytest.fixture(scope="module", autouse=True)
def servers_stop_with_their_module() -> Iterator[None]:
    """The servers a test module started stop when the module ends. Left running until the
    session's end, idle servers (their monitors and pollers wake a few times a second) added up:
    with a hundred of them late in a full run, a quarter of a core went to servers nobody asked,
    stalls that timed tests then measured."""
    first = len(_STARTED)
    yield
    stop_all([s for s in _STARTED[first:] if not s.shared])


@pytest.fixture(scope="session")
def server_factory(tmp_path_factory, real_models) -> Iterator:
    """make(config, name): a started `eie serve`, settled unless `wait` is false; it stops when
    its test module ends (`shared`: when the session does)."""
    facts = tmp_path_factory.mktemp("file-facts")

    def make(config: dict[str, Any], name: str = "server", wait: bool = True, env: dict | None = None,
             shared: bool = False) -> Server:
        srv = Server(config, tmp_path_factory.mktemp(name), name, env, facts).start()
        srv.shared = shared
        _STARTED.append(srv)
        if wait:
            srv.wait_settled()
        return srv

    yield make
    stop_all(_STARTED)


@pytest.fixture(scope="session")
def main_server(server_factory) -> Server:
    """Both real models; smollm2 with 8 sequence slots for the concurrency tests."""
    return server_factory(
        {
            "models": [
                model_entry("smollm2-135m", SMOLLM2, n_parallel=8),
                model_entry("gemma3-270m", GEMMA3, n_parallel=2),
            ]
        },
        "main",
        shared=True,
    )


def copy_model(src: Path, dst_dir: Path) -> Path:
    dst = dst_dir / src.name
    shutil.copyfile(src, dst)
    return dst


@pytest.fixture
def one_model_manager(real_models) -> Iterator[Any]:
    """A started generic-strategy ModelManager for SmolLM2 as `m` (512 cells, one sequence, one
    thread), stopped after the test; nothing is loaded yet."""
    from appliance.config import parse_config
    from appliance.engine.manager import ModelManager
    from appliance.resources.cores import CoreBudget

    config = parse_config({"policy": {"strategy": "generic"},
                           "models": [model_entry("m", SMOLLM2, n_ctx=512, n_parallel=1, threads=1)]})
    manager = ModelManager(config, CoreBudget(1))
    manager.start()
    try:
        yield manager
    finally:
        manager.stop()
