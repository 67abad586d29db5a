"""Start-up time of the appliance: exec to /health 200 with the default preset, the frozen
executable (dist/eie/eie, `make binary`) and `eie serve` from the virtualenv side by side.

Runs alternate between the two; each figure is the median of --runs. The first start of each
(reported apart) runs with an empty cache directory: it hashes the GGUF files, reads their
headers and measures the K means (engine/k_centering.py); later starts find those in the cache,
as a restarted appliance does. Writes bench/results/startup_time.json.
Usage: .venv/bin/python bench/startup_time.py [--runs 5] [--only "eie serve"]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import yaml
from eie_server import EieServer

ROOT = Path(__file__).resolve().parent.parent


def time_to_health(cmd: list[str], config: dict, env: dict[str, str] | None) -> float:
    with tempfile.TemporaryDirectory() as state:
        srv = EieServer(config, Path(state), cmd=cmd, env=env, cwd="/", poll_s=0.01)
        srv.stop()
        return srv.started_s


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
    first: dict[str, float] = {}
    for name, (cmd, env) in cmds.items():  # cold caches, one directory each
        first[name] = time_to_health(cmd, config, {**env, "EIE_CACHE_DIR": str(cache / name.replace(" ", "-"))})
    runs: dict[str, list[float]] = {name: [] for name in cmds}
    for _ in range(args.runs):
        for name, (cmd, env) in cmds.items():
            runs[name].append(time_to_health(cmd, config, {**env, "EIE_CACHE_DIR": str(cache / name.replace(" ", "-"))}))
    result = {name: {"median_s": round(statistics.median(v), 2), "runs_s": [round(x, 2) for x in v],
                     "first_start_s": round(first[name], 2)}
              for name, v in runs.items()}
    result["preset"] = "presets/fixed-appliance.yaml"
    out = ROOT / "bench" / "results" / "startup_time.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
