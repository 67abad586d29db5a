"""What a batch of n rows costs with Q4_1 weights: the shipped x86 kernels (patch 0006's tiles of
8 weight rows, one per vector lane, with patch 0002's 4x4 tiles for the rest) against patch
0002's 4x4 tiles alone (EIE_Q4_1_TILES=4) and upstream's one-row vec_dot (EIE_Q4_1_TILES=0),
side by side in one run (row_costs.py).

For SmolLM2-135M (Q4_1 layers, Q8_0 embeddings) after a 300-token context (--context):
llama_decode time of one sequence with n new tokens, logits for every row (what a speculative
verification or n decoding sequences cost), and the prefill of 512 tokens. Each (kernel, repeat)
runs in its own process (the switch is read once), kernels alternate, medians of the repeats.
Usage: .venv/bin/python bench/q4_1_rows.py [--repeats 3] [--threads 2] [--context 300] [--out PATH]
Prints a table and writes bench/results/q4_1_rows.json (or --out); bench/speculative_replay.py
reads its costs from such a file.
"""

from __future__ import annotations

from pathlib import Path

from row_costs import ROOT, arguments, compare
from row_decoder import MODEL

SETTINGS = {"tiled": {"EIE_Q4_1_TILES": "1"}, "tiles 4x4": {"EIE_Q4_1_TILES": "4"},
            "vec_dot": {"EIE_Q4_1_TILES": "0"}}

if __name__ == "__main__":
    args = arguments(__doc__, ROOT / "bench" / "results" / "q4_1_rows.json")
    raise SystemExit(compare(str(Path(__file__).resolve()), args, "SmolLM2-135M Q4_1", MODEL, SETTINGS))
