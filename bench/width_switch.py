"""What a decode costs when its width differs from the previous decode's: llama.cpp reuses the
previous compute graph only when the ubatch has the same shape, so a speculative runner whose
steps alternate between 1 row (nothing drafted) and 1 + k rows (a verification) rebuilds and
reallocates the graph at every switch. Side by side in one process (SmolLM2-135M Q4_1, one
sequence after a 300-token context): decodes of one width only against widths alternating in
a pattern, with the graphs of several shapes kept (patch 0008), the last graph only
(LLAMA_GRAPH_KEEP=1, upstream's reuse) and reuse off (LLAMA_GRAPH_REUSE_DISABLE); both are read
when the context is made, so each setting runs in its own child process, and the settings
alternate over the repeats.

Usage: .venv/bin/python bench/width_switch.py [--repeats 3] [--threads 2] [--steps 200] [--out PATH]
Prints a table and writes bench/results/width_switch.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATTERNS = {"1 only": (1,), "3 only": (3,), "1,3 alternating": (1, 3), "1,1,1,3": (1, 1, 1, 3)}
SETTINGS = {"kept graphs": {}, "last graph only": {"LLAMA_GRAPH_KEEP": "1"},
            "reuse off": {"LLAMA_GRAPH_REUSE_DISABLE": "1"}}
CONTEXT = 300


def child(threads: int, steps: int) -> dict[str, dict[str, float]]:
    """One process: median decode ms by width for each pattern."""
    from row_decoder import RowDecoder

    dec = RowDecoder(threads)
    rng = random.Random(0)
    dec.prefill([rng.randrange(1000, 20000) for _ in range(CONTEXT)])
    out: dict[str, dict[str, float]] = {}
    for name, pattern in PATTERNS.items():
        dec.truncate(CONTEXT)
        pos, by = CONTEXT, {}
        for i in range(steps):
            rows = pattern[i % len(pattern)]
            by.setdefault(rows, []).append(dec.decode([rng.randrange(1000, 20000) for _ in range(rows)], pos))
            dec.truncate(pos + 1)  # keep one token, as a step that accepted no draft does
            pos += 1
        out[name] = {str(r): round(statistics.median(v), 3) for r, v in sorted(by.items())}
    dec.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "width_switch.json")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        print(json.dumps(child(args.threads, args.steps)))
        return 0
    runs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
    for _ in range(args.repeats):
        for setting, env in SETTINGS.items():
            res = subprocess.run([sys.executable, __file__, "--child", "--threads", str(args.threads),
                                  "--steps", str(args.steps)], env={**os.environ, **env},
                                 capture_output=True, text=True, check=True)
            runs[setting].append(json.loads(res.stdout.strip().splitlines()[-1]))
    median = {s: {p: {w: round(statistics.median(r[p][w] for r in rs), 3) for w in rs[0][p]} for p in PATTERNS}
              for s, rs in runs.items()}
    print(f"SmolLM2-135M Q4_1, {args.threads} threads, context {CONTEXT}, median of {args.repeats} processes "
          f"({args.steps} decodes per pattern)")
    print("| pattern | " + " | ".join(f"{s}: ms by width" for s in SETTINGS) + " |")
    print("|---|" + "---|" * len(SETTINGS))
    for p in PATTERNS:
        cells = [", ".join(f"{w} row{'s' if w != '1' else ''} {ms}" for w, ms in median[s][p].items()) for s in SETTINGS]
        print(f"| {p} | " + " | ".join(cells) + " |")
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "threads": args.threads,
                                    "context": CONTEXT, "steps": args.steps, "repeats": args.repeats,
                                    "median_ms": median, "runs": runs}, indent=1))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
