"""What a batch of n rows costs with Q4_1 weights: patch 0002's tiled x86 kernel against upstream's
one-row vec_dot (EIE_Q4_1_TILES=0), side by side in one run.

For SmolLM2-135M (Q4_1 layers, Q8_0 embeddings) after a 300-token context (--context):
llama_decode time of one sequence with n new tokens, logits for every row (what a speculative
verification or n decoding sequences cost), and the prefill of 512 tokens. Each (kernel, repeat) runs in its own
process (the switch is read once), kernels alternate, medians of the repeats.
Usage: .venv/bin/python bench/q4_1_rows.py [--repeats 3] [--threads 2] [--context 300] [--out PATH]
Prints a table and writes bench/results/q4_1_rows.json (or --out); bench/speculative_replay.py
reads its costs from such a file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ROWS = tuple(range(1, 18))  # every width a verification with max_draft 16 can have
CONTEXT = 300


def measure(threads: int, reps: int, context: int = CONTEXT) -> dict[str, float]:
    """One process: decode times (ms, median of `reps`) by rows, and the 512-token prefill."""
    from row_decoder import RowDecoder

    dec = RowDecoder(threads)
    out: dict[str, float] = {}
    prefill = []
    for r in range(reps):
        dec.truncate(0)
        prefill.append(dec.decode([100 + (r + i) % 1000 for i in range(512)], 0))
    out["prefill_512"] = statistics.median(prefill)
    dec.prefill([100 + i % 1000 for i in range(context)])
    for n in ROWS:
        dec.decode([200 + i % 500 for i in range(n)], context)  # untimed: the first decode of a width warms up
        dec.truncate(context)
        times = []
        for r in range(reps):
            times.append(dec.decode([200 + (r + i) % 500 for i in range(n)], context))
            dec.truncate(context)
        out[str(n)] = statistics.median(times)
    dec.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3, help="processes per kernel")
    ap.add_argument("--reps", type=int, default=30, help="timed decodes per row count in a process")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=CONTEXT, help="tokens in the KV before the timed decodes")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "q4_1_rows.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(measure(args.threads, args.reps, args.context)))
        return 0
    runs: dict[str, list[dict[str, float]]] = {"tiled": [], "vec_dot": []}
    for _ in range(args.repeats):
        for kernel, flag in (("tiled", "1"), ("vec_dot", "0")):
            proc = subprocess.run([sys.executable, __file__, "--child", "--threads", str(args.threads),
                                   "--reps", str(args.reps), "--context", str(args.context)],
                                  env={**os.environ, "EIE_Q4_1_TILES": flag}, capture_output=True, text=True, check=True)
            runs[kernel].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    med = {k: {key: round(statistics.median(r[key] for r in v), 2) for key in v[0]} for k, v in runs.items()}
    print(f"SmolLM2-135M Q4_1, {args.threads} threads, context {args.context}, median of {args.repeats} processes")
    print("| rows | vec_dot (upstream) ms | x one row | tiled (patch 0002) ms | x one row | speed-up |")
    print("|---|---|---|---|---|---|")
    for n in map(str, ROWS):
        u, t = med["vec_dot"][n], med["tiled"][n]
        print(f"| {n} | {u} | {u / med['vec_dot']['1']:.2f} | {t} | {t / med['tiled']['1']:.2f} | {u / t:.2f}x |")
    u, t = med["vec_dot"]["prefill_512"], med["tiled"]["prefill_512"]
    print(f"| prefill 512 | {u} | | {t} | | {u / t:.2f}x |")
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "threads": args.threads, "context": args.context,
                               "repeats": args.repeats, "median_ms": med, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
