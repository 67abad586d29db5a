"""What a batch of n rows costs on Gemma 3 270M (Q4_K_M: Q5_0 and Q4_K layers, some Q6_K and Q8_0,
a 262144 x 640 Q8_0 output layer): patch 0004's kernels against upstream's, side by side in one run
(row_costs.py).

Patch 0004 sends Q8_0 products of every size (one row too) through a 512-bit VNNI kernel
(x86 with AVX512-VNNI; EIE_Q8_0_VNNI=0 turns it off) and keeps K-quant batches under 64 rows on
vec_dot (EIE_BATCH_INVARIANT_ROWS=8 restores upstream's 8). Its third change, the repacked Q4_K
gemm summing a super block before scaling it, has no switch: it costs nothing measurable.
Usage: .venv/bin/python bench/gemma_rows.py [--repeats 3] [--threads 2] [--context 300] [--out PATH]
Prints a table and writes bench/results/gemma_rows.json (or --out).
"""

from __future__ import annotations

from pathlib import Path

from row_costs import ROOT, arguments, compare

MODEL = ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"
SETTINGS = {"patch 0004": {"EIE_Q8_0_VNNI": "1"},
            "upstream": {"EIE_Q8_0_VNNI": "0", "EIE_BATCH_INVARIANT_ROWS": "8"}}

if __name__ == "__main__":
    args = arguments(__doc__, ROOT / "bench" / "results" / "gemma_rows.json")
    raise SystemExit(compare(str(Path(__file__).resolve()), args, "Gemma 3 270M Q4_K_M", MODEL, SETTINGS))
