"""What attention adds to a decode of n rows as the context grows, side by side in one run, f16
KV, SmolLM2-135M: flash attention with patch 0003's blocked decode path (what EIE runs), flash
attention with llama.cpp's own path (EIE_FA_BLOCKS=0), and flash attention off.

A speculative verification decodes one sequence's regular token and its drafts as n rows.
llama.cpp's CPU flash-attention kernel handles each (query row, head) on its own, so every row
reads the whole KV and the cost of an extra row grows with the context. Patch 0003 takes the
rows of a KV head group together, per block of 32 cells (the scores and the V sums as small
matrix products). Without flash attention K·Q is one matrix product for all rows, but a decode
of several rows is then not batch-invariant (the column "exact rows", speculative/exactness.py),
so greedy speculation would lose its drafts, and quantized KV types need flash attention anyway.

Each (setting, repeat) runs in its own process (the switch is read once), settings alternate;
in a process, for each context length: llama_decode time of one sequence with n new tokens after
that many tokens of context (logits for every row), median of --reps; the table gives the median
over the processes.
Usage: .venv/bin/python bench/attention_rows.py [--contexts 100,500,1500] [--repeats 3] [--reps 5] [--threads 2]
Prints a table and writes bench/results/attention_rows.json.
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
ROWS = (1, 2, 4, 5, 8, 12, 17)
# setting: (llama_flash_attn_type, EIE_FA_BLOCKS)
SETTINGS = {"blocks (EIE)": (1, "1"), "one-row (llama.cpp)": (1, "0"), "off": (0, "1")}


def measure(flash_attn: int, contexts: list[int], threads: int, reps: int) -> dict:
    """One process: the exact rows, and ms by context and rows (median of `reps`)."""
    sys.path.insert(0, str(ROOT))
    from appliance.engine.speculative.exactness import exact_rows
    from row_decoder import RowDecoder

    dec = RowDecoder(threads, flash_attn)
    exact = exact_rows(dec.ctx, dec.n_vocab, max(ROWS))
    tokens = [(7919 * i + 13) % dec.n_vocab for i in range(max(contexts) + max(ROWS) + reps)]  # arbitrary, fixed
    ms: dict[str, dict[str, float]] = {}
    for context in contexts:
        dec.prefill(tokens[:context])
        ms[str(context)] = {}
        for n in ROWS:
            dec.decode(tokens[context:context + n], context)  # untimed: the first decode of a width warms up
            dec.truncate(context)
            times = []
            for r in range(reps):
                times.append(dec.decode(tokens[context + r:context + r + n], context))
                dec.truncate(context)
            ms[str(context)][str(n)] = statistics.median(times)
    dec.close()
    return {"exact_rows": exact, "ms": ms}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="100,500,1500")
    ap.add_argument("--repeats", type=int, default=3, help="processes per setting")
    ap.add_argument("--reps", type=int, default=5, help="timed decodes per (context, rows) in a process")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    contexts = [int(c) for c in args.contexts.split(",")]
    if args.child is not None:
        print(json.dumps(measure(args.child, contexts, args.threads, args.reps)))
        return 0
    runs: dict[str, list[dict]] = {s: [] for s in SETTINGS}
    for rep in range(args.repeats):
        order = list(SETTINGS) if rep % 2 == 0 else list(reversed(SETTINGS))
        for setting in order:
            fa, blocks = SETTINGS[setting]
            proc = subprocess.run([sys.executable, __file__, "--child", str(fa), "--contexts", args.contexts,
                                   "--threads", str(args.threads), "--reps", str(args.reps)],
                                  env={**os.environ, "EIE_FA_BLOCKS": blocks}, capture_output=True, text=True,
                                  check=True)
            runs[setting].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    exact = {s: min(r["exact_rows"] for r in v) for s, v in runs.items()}
    table = {str(c): {s: {str(n): round(statistics.median(r["ms"][str(c)][str(n)] for r in v), 2) for n in ROWS}
                      for s, v in runs.items()} for c in contexts}

    print(f"SmolLM2-135M, f16 KV, {args.threads} threads, ms per decode, median of {args.repeats} processes")
    print(f"\n| context | attention | exact rows | {' | '.join(f'{n} rows' for n in ROWS)} |")
    print("|---|---|---|" + "---|" * len(ROWS))
    for context, by_setting in table.items():
        for setting, ms in by_setting.items():
            print(f"| {context} | {setting} | {exact[setting]} | {' | '.join(f'{ms[str(n)]:.1f}' for n in ROWS)} |")
    out = ROOT / "bench" / "results" / "attention_rows.json"
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "model": "SmolLM2-135M-Instruct.Q4_1.gguf",
                               "kv": "f16", "threads": args.threads, "repeats": args.repeats, "reps": args.reps,
                               "exact_rows": exact, "median_ms": table, "runs": runs}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
