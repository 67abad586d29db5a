"""Helpers for the operations tests: metrics parsing, SSE reading, audit file location."""

from __future__ import annotations

import contextlib
import subprocess
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families


def metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    return sum(v for n, ls, v in metric_samples(text) if n == name and all(ls.get(k) == x for k, x in labels.items()))


def has_family(text: str, name: str) -> bool:
    return any(fam.name == name for fam in text_string_to_metric_families(text))


def audit_path(srv, name: str = "audit.log") -> Path:
    return srv.config_path.parent / f"{srv.config_path.stem}-state" / name


def wait_for(cond, timeout: float = 30, step: float = 0.1):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = cond()
        if got:
            return got
        time.sleep(step)
    raise TimeoutError("condition not met in time")


def sse_events(r: httpx.Response) -> list[str]:
    return [line[6:] for line in r.iter_lines() if line.startswith("data: ")]


@contextlib.contextmanager
def small_tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (mount's form: 256k, 2m) mounted at `path` meanwhile: a file system that
    fills for real (the test is skipped where mounting is not allowed). Unmounted lazily: a server
    a failed test left running does not keep it mounted."""
    path.mkdir(exist_ok=True)
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)
