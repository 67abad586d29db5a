"""Start-up time of the appliance: exec to /health 200 with the default preset, the frozen
executable (dist/eie/eie, `make binary`) and `eie serve` from the virtualenv side by side.

Runs alternate between the two; each figure is the median of --runs. Each run also times exec to
an answer from every model (one token each, asked together as soon as /health is 200). The first
start of each (reported apart) runs with an empty cache directory: it hashes the GGUF files,
tries their headers in a child, measures the K means (engine/k_centering.py) and, at each
runner's first step, the exactness probe; later starts find those in the cache, as a restarted
appliance does. Writes bench/results/startup_time.json.
Usage: .venv/bin/python bench/startup_time.py [--runs 5] [--only "eie serve"]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from eie_server import EieServer

ROOT = Path(__file__).resolve().parent.parent


def time_to_health(cmd: list[str], config: dict, env: dict[str, str] | None) -> tuple[float, float]:
    """(exec to /health 200, exec to an answer from every model: one token each, asked together)."""
    with tempfile.TemporaryDirectory() as state:
        srv = EieServer(config, Path(state), cmd=cmd, env=env, cwd="/", poll_s=0.01)
        try:
            with concurrent.futures.ThreadPoolExecutor(len(config["models"])) as pool:
                answers = list(pool.map(lambda m: httpx.post(srv.base + "/v1/chat/completions", timeout=120, json={
                    "model": m["name"], "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}),
                    config["models"]))
            assert all(r.status_code == 200 for r in answers), [r.text for r in answers]
            answered = time.monotonic() - srv.t0
        finally:
            srv.stop()
        return srv.started_s, answered


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--binary", default=str(ROOT / "dist" / "eie" / "eie"))
    ap.add_argument("--only", choices=["frozen", "eie serve"], default=None)
    args = ap.parse_args()
    preset = ROOT / "presets" / "fixed-appliance.yaml"
    config = yaml.safe_load(preset.read_text())
    config["model_dir"] = str((preset.parent / config["model_dir"]).resolve())
    ap_only = args.only
    cache = Path(tempfile.mkdtemp(prefix="eie-startup-cache-"))
    cmds = {"frozen": ([args.binary], {}), "eie serve": ([str(Path(sys.executable).parent / "eie")], dict(os.environ))}
    cmds = {k: v for k, v in cmds.items() if not ap_only or k == ap_only}
    first: dict[str, tuple[float, float]] = {}
    for name, (cmd, env) in cmds.items():  # cold caches, one directory each
        first[name] = time_to_health(cmd, config, {**env, "EIE_CACHE_DIR": str(cache / name.replace(" ", "-"))})
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in cmds}
    for _ in range(args.runs):
        for name, (cmd, env) in cmds.items():
            runs[name].append(time_to_health(cmd, config, {**env, "EIE_CACHE_DIR": str(cache / name.replace(" ", "-"))}))
    result = {name: {"median_s": round(statistics.median(h for h, _ in v), 2), "runs_s": [round(h, 2) for h, _ in v],
                     "first_answers_median_s": round(statistics.median(a for _, a in v), 2),
                     "first_start_s": round(first[name][0], 2), "first_start_answers_s": round(first[name][1], 2)}
              for name, v in runs.items()}
    result["preset"] = "presets/fixed-appliance.yaml"
    out = ROOT / "bench" / "results" / "startup_time.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
