"""A real `eie serve` process for the benches: config written to the run's directory, started,
waited for until /health answers 200, stopped with SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

EIE = Path(sys.executable).parent / "eie"
# Where EIE runs from a checkout without being installed (bench/cuda_check.sh on a bare host).
EIE_CMD = [str(EIE)] if EIE.exists() else [sys.executable, "-m", "appliance"]


class StartFailed(RuntimeError):
    """`eie serve` exited or stayed unhealthy during start-up; `log` is its output file."""

    def __init__(self, what: str, log: Path):
        super().__init__(f"{what} (log: {log})")
        self.log = log


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EieServer:
    """`cmd serve` on `config` (its server.host/port are set here) with its log in `state`.

    `started_s`: seconds from exec to the first /health 200 (polled every `poll_s`).
    """

    def __init__(self, config: dict, state: Path, start_timeout: float = 180, *, cmd: list[str] | None = None,
                 args: tuple[str, ...] = (), env: dict[str, str] | None = None, cwd: str | None = None,
                 poll_s: float = 0.1):
        self.port = free_port()
        config = {**config, "server": {**config.get("server", {}), "host": "127.0.0.1", "port": self.port}}
        self.cfg_path = state / f"bench-{self.port}.yaml"
        self.cfg_path.write_text(yaml.safe_dump(config))
        self.log = open(state / f"bench-{self.port}.log", "wb")
        self.t0 = t0 = time.monotonic()
        self.proc = subprocess.Popen([*(cmd or EIE_CMD), "serve", "--config", str(self.cfg_path), *args],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        self.base = f"http://127.0.0.1:{self.port}"
        end = t0 + start_timeout
        while time.monotonic() < end:
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    self.started_s = time.monotonic() - t0
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                self.log.close()
                raise StartFailed(f"eie serve exited with {self.proc.returncode}", Path(self.log.name))
            time.sleep(poll_s)
        self.stop()
        raise StartFailed(f"eie serve did not become healthy in {start_timeout:.0f} s", Path(self.log.name))

    def stop(self) -> int:
        """SIGTERM, then the exit status."""
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        self.log.close()
        return code
