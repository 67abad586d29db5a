"""A real `eie serve` process for the benches: config written to the run's directory, started,
waited for until /health answers 200, stopped with SIGTERM."""

from __future__ import annotations

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class EieServer:
    """`eie serve` on `config` (its server.host/port are set here) with its log in `state`."""

    def __init__(self, config: dict, state: Path, start_timeout: float = 180):
        self.port = free_port()
        config = {**config, "server": {**config.get("server", {}), "host": "127.0.0.1", "port": self.port}}
        self.cfg_path = state / f"bench-{self.port}.yaml"
        self.cfg_path.write_text(yaml.safe_dump(config))
        self.log = open(state / f"bench-{self.port}.log", "wb")
        self.proc = subprocess.Popen([*EIE_CMD, "serve", "--config", str(self.cfg_path)], stdout=self.log,
                                     stderr=subprocess.STDOUT)
        self.base = f"http://127.0.0.1:{self.port}"
        end = time.monotonic() + start_timeout
        while time.monotonic() < end:
            try:
                if httpx.get(self.base + "/health", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if self.proc.poll() is not None:
                self.log.close()
                raise RuntimeError(f"eie serve exited with {self.proc.returncode} (log: {self.log.name})")
            time.sleep(0.1)
        self.stop()
        raise TimeoutError(f"eie serve did not become healthy in {start_timeout:.0f} s (log: {self.log.name})")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=60)
        self.log.close()
