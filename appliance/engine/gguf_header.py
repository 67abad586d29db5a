"""A GGUF file's metadata, read by llama.cpp in a child process (`eie gguf-header PATH`) that also
tries the model: a load, a context, and the checks of engine/gguf_checks.py.

llama.cpp aborts the whole process on some malformed files instead of failing the load: a
vocabulary with a token written twice fails `GGML_ASSERT(id_to_token.size() ==
token_to_id.size())`, a `block_count` of 0 fails at the load, K/V heads that do not divide the
query heads fail when the context builds its graphs (tests/unit/engine/test_gguf_trial.py). A
file named in the config, or dropped into model_dir and listed by the admin discover endpoint,
must fail alone, so it is tried here first. The answer is cached per file version by the caller
(engine/manager.py shape_of), so the child runs once per new file: 0.44 s for SmolLM2, 0.92 s for
Gemma 3 on this machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

TIMEOUT_S = 300.0


def self_command() -> list[str]:
    """The `eie` command of this process: the frozen executable itself, or this Python's package."""
    if getattr(sys, "frozen", False):
        return [sys.executable]
    return [sys.executable, "-m", "appliance"]


def read(path: Path) -> dict[str, str]:
    """The metadata as strings, plus `n_vocab` (engine/native.read_header, in a child); raises
    ValueError naming what failed, also when llama.cpp aborted."""
    if not path.is_file():
        raise ValueError(f"model file not found: {path}")
    env = {**os.environ, "GGML_NO_BACKTRACE": "1"}  # an abort prints its assertion, not a debugger's backtrace
    try:
        proc = subprocess.run([*self_command(), "gguf-header", str(path)], capture_output=True, text=True,
                              timeout=TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ValueError(f"reading the header of {path.name} took over {TIMEOUT_S:.0f} s") from None
    if proc.returncode == 0:
        try:
            return json.loads(proc.stdout)
        except ValueError:
            raise ValueError(f"reading the header of {path.name} gave no metadata: {proc.stdout[-200:]!r}") from None
    raise ValueError(_failure(path, proc.returncode, proc.stderr))


def _failure(path: Path, returncode: int, stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    asserted = next((ln for ln in lines if "GGML_ASSERT" in ln or "GGML_ABORT" in ln), None)
    if asserted is not None:
        return f"llama.cpp aborted reading {path.name}: {asserted.split(': ', 1)[-1]}"
    said = next((ln[len("eie: "):] for ln in reversed(lines) if ln.startswith("eie: ")), None)
    if said is not None:
        return said
    how = f"signal {-returncode}" if returncode < 0 else f"exit status {returncode}"
    return f"reading the header of {path.name} failed ({how}): {lines[-1] if lines else 'no output'}"
