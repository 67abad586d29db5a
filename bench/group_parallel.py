"""Parallel group wall time against running its members one after another, side by side.

Starts `eie serve` with a 3-model parallel group (smollm2-135m, gemma3-270m, smollm2-135m-b),
then alternates, per repeat: (a) one POST /v1/batch/execute of the group, (b) the same chat
request to each member in turn. Same prompt, temperature 0, same max_tokens, so both do the same
work. Prints a table and writes bench/results/group_parallel.json.

    .venv/bin/python bench/group_parallel.py [--repeats 5] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from eie_server import EieServer

ROOT = Path(__file__).resolve().parent.parent
MEMBERS = [("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf"), ("gemma3-270m", "gemma-3-270m-q4_k_m.gguf"),
           ("smollm2-135m-b", "SmolLM2-135M-Instruct.Q4_1.gguf")]
PROMPT = [{"role": "user", "content": "Write a short paragraph about lighthouses and the sea."}]


def config(threads: int) -> dict:
    return {
        "model_dir": str(ROOT / "models"),
        "models": [{"name": n, "path": p, "n_ctx": 1024, "n_parallel": 1, "threads": threads} for n, p in MEMBERS],
        "groups": [{"name": "core", "models": [n for n, _ in MEMBERS], "type": "parallel"}],
    }


def group_once(client: httpx.Client, max_tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    r = client.post("/v1/batch/execute", json={"group": "core", "messages": PROMPT, "max_tokens": max_tokens,
                                               "temperature": 0})
    wall = time.perf_counter() - t0
    body = r.json()
    assert r.status_code == 200 and body["complete"], body
    return wall, body["usage"]["completion_tokens"]


def sequential_once(client: httpx.Client, max_tokens: int) -> tuple[float, int]:
    t0 = time.perf_counter()
    tokens = 0
    for name, _ in MEMBERS:
        r = client.post("/v1/chat/completions", json={"model": name, "messages": PROMPT, "max_tokens": max_tokens,
                                                      "temperature": 0})
        assert r.status_code == 200, r.text
        tokens += r.json()["usage"]["completion_tokens"]
    return time.perf_counter() - t0, tokens


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "group_parallel.json")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        srv = EieServer(config(args.threads), Path(tmp), 120, args=("--log-level", "warning"))
        try:
            group_walls, seq_walls, tokens = [], [], set()
            with httpx.Client(base_url=srv.base, timeout=600) as client:
                group_once(client, 8)  # warm-up
                sequential_once(client, 8)
                for i in range(args.repeats):
                    runs = [("group", group_once), ("sequential", sequential_once)]
                    for label, fn in (runs if i % 2 == 0 else runs[::-1]):
                        wall, n = fn(client, args.max_tokens)
                        (group_walls if label == "group" else seq_walls).append(wall)
                        tokens.add((label, n))
        finally:
            srv.stop()

    g, s = statistics.median(group_walls), statistics.median(seq_walls)
    result = {
        "benchmark": "group_parallel",
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cores": os.cpu_count(),
        "threads_per_model": args.threads,
        "max_tokens": args.max_tokens,
        "repeats": args.repeats,
        "members": [n for n, _ in MEMBERS],
        "completion_tokens": sorted(tokens),
        "group_wall_s": {"median": g, "runs": group_walls},
        "sequential_wall_s": {"median": s, "runs": seq_walls},
        "ratio_group_over_sequential": g / s,
        "goal": "group wall time <= sequential (ratio <= 1.0)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'figure':<34}{'median s':>10}")
    print(f"{'parallel group (3 members)':<34}{g:>10.2f}")
    print(f"{'members one after another':<34}{s:>10.2f}")
    print(f"{'ratio group / sequential':<34}{g / s:>10.2f}  (goal <= 1.00)")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
