"""What a llama_decode of n rows of one sequence costs under several kernel settings, side by side in
one run: shared by q4_1_rows.py (SmolLM2, patches 0002 and 0006) and gemma_rows.py (Gemma 3, patch 0004).

Each (setting, repeat) runs in its own child process, because the kernels read their switch once;
settings alternate; the table and the JSON hold medians over the processes. A child times every
width a speculative verification with max_draft 16 can have after `context` tokens (logits for
every row: what a verification or that many decoding sequences cost), and a 512-token prefill."""

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


def measure(model: Path, threads: int, reps: int, context: int) -> dict[str, float]:
    """One process: decode times (ms, median of `reps`) by rows, and the 512-token prefill."""
    from row_decoder import RowDecoder

    dec = RowDecoder(threads, model=model)
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


def arguments(doc: str, default_out: Path) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--repeats", type=int, default=3, help="processes per setting")
    ap.add_argument("--reps", type=int, default=30, help="timed decodes per row count in a process")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--context", type=int, default=CONTEXT, help="tokens in the KV before the timed decodes")
    ap.add_argument("--out", type=Path, default=default_out)
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)  # the model a child process measures
    return ap.parse_args()


def compare(script: str, args: argparse.Namespace, title: str, model: Path,
            settings: dict[str, dict[str, str]]) -> int:
    """Run `settings` (name: environment; the first is the shipped kernel, the others what it is
    compared with) alternately in child processes of `script`, print the table and write the JSON."""
    if args.child:
        print(json.dumps(measure(args.child, args.threads, args.reps, args.context)))
        return 0
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in settings}
    for _ in range(args.repeats):
        for name, env in settings.items():
            proc = subprocess.run([sys.executable, script, "--child", str(model), "--threads", str(args.threads),
                                   "--reps", str(args.reps), "--context", str(args.context)],
                                  env={**os.environ, **env}, capture_output=True, text=True, check=True)
            runs[name].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    med = {k: {key: round(statistics.median(r[key] for r in v), 2) for key in v[0]} for k, v in runs.items()}
    shipped, *others = settings
    print(f"{title}, {args.threads} threads, context {args.context}, median of {args.repeats} processes")
    print("| rows | " + " | ".join(f"{name} ms | x one row" for name in settings) + " | "
          + " | ".join(f"speed-up over {name}" for name in others) + " |")
    print("|---|" + "---|---|" * len(settings) + "---|" * len(others))
    for n in map(str, ROWS):
        cells = [f"{med[name][n]} | {med[name][n] / med[name]['1']:.2f}" for name in settings]
        ratios = [f"{med[name][n] / med[shipped][n]:.2f}x" for name in others]
        print(f"| {n} | " + " | ".join(cells + ratios) + " |")
    key = "prefill_512"
    cells = [f"{med[name][key]} | " for name in settings]
    ratios = [f"{med[name][key] / med[shipped][key]:.2f}x" for name in others]
    print("| prefill 512 | " + " | ".join(cells + ratios) + " |")
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "threads": args.threads,
                                    "context": args.context, "repeats": args.repeats, "settings": settings,
                                    "median_ms": med, "runs": runs}, indent=1))
    return 0
