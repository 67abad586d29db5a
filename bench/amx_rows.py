"""What a batch of n rows costs with SmolLM2's weights in ggml's AMX buffer, on a host with AMX (where
the setup build has it; elsewhere the script refuses to run). The setup build (patch 0009's
avx512-vnni kernel up to 4 rows, patch 0013's AMX rows kernel for 5-32 rows, AMX tiles beyond),
against patch 0009 alone (EIE_AMX_ROWS_MIN=0: the vnni kernel up to EIE_AMX_VNNI_ROWS rows,
default 8, AMX tiles beyond), upstream's split (the vnni kernel for one row, AMX tiles from two)
and the weights in the file's layout (no extra buffer types: patches 0002-0006's Q4_1 kernels and
patch 0004's Q8_0 output layer, what a host without AMX runs), side by side in one run
(row_costs.py).

Usage: .venv/bin/python bench/amx_rows.py [--repeats 3] [--threads 2] [--context 300] [--out PATH]
Prints a table and writes bench/results/amx_rows.json (or --out).
"""

from __future__ import annotations

import sys
from pathlib import Path

from row_costs import ROOT, arguments, compare
from row_decoder import MODEL

SETTINGS = {"AMX rows + vnni rows": {}, "vnni rows, AMX tiles from 9": {"EIE_AMX_ROWS_MIN": "0"},
            "AMX tiles from 2 rows": {"EIE_AMX_VNNI_ROWS": "1", "EIE_AMX_ROWS_MIN": "0"},
            "file layout": {"EIE_BENCH_NO_EXTRA_BUFTS": "1"}}


def build_has_amx() -> bool:
    sys.path.insert(0, str(ROOT))
    from appliance.resources import repack

    return repack.build_has_amx()


if __name__ == "__main__":
    args = arguments(__doc__, ROOT / "bench" / "results" / "amx_rows.json")
    if not args.child and not build_has_amx():
        raise SystemExit("this llama.cpp build has no AMX; see the docstring")
    raise SystemExit(compare(str(Path(__file__).resolve()), args, "SmolLM2-135M Q4_1", MODEL, SETTINGS))
