"""llama.cpp's own op test (tests/test-backend-ops.cpp, built by `make setup` against the
installed ggml) on the TurboQuant cases the patch adds: SET_ROWS, GET_ROWS, CPY and
FLASH_ATTN_EXT with turbo4/3/2 K and V, and K q8_0 with V turbo; on FLASH_ATTN_EXT with f16 K
and V, where patch 0003 sends decodes and verifications (at most 32 query tokens) through the
grouped path in blocks of cells; on MUL_MAT with Q4_1 weights, where patch 0002 adds a tiled x86
kernel and patch 0006 tiles of 8 weight rows in vector lanes (m = 20 takes both: 16 rows in lanes,
4 in the 4x4 tiles), and with Q8_0 weights, where patch 0004 adds a VNNI one for every batch size, its activations
prepared per chunk of up to 64 rows (n = 509 and 4096 take several chunks). The reference mode
skips llamafile's kernels, so there they are compared with ggml's vec_dot; a 2% error in Q4_1's
min term fails it, and a 5% error in Q8_0's scales, both checked by hand.

On a CPU-only build test-backend-ops compares the CPU backend with the CPU backend in its
reference mode (`ggml_backend_cpu_set_use_ref`): for flash attention that is the patches'
grouped-query decode path against llama.cpp's one-row-at-a-time path (a 10% error in
the former fails it; checked by hand). It runs with 1 thread and with 3, so the paths that
split a KV head's query heads over threads run too. For the other ops both sides run the same code, so there
the test proves support, no abort and repeatable results (the codec tests and
bench/kv_quality.py check the values). On a CUDA or HIP build the same binary compares the GPU
backend with the CPU."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BINARY = Path(sys.executable).parent / "test-backend-ops"


def run_cases(args: list[str], threads: int) -> tuple[str, int]:
    """test-backend-ops in test mode on the CPU with `threads`: its output and how many cases ran;
    asserts every case it ran passed."""
    assert BINARY.is_file(), f"{BINARY} is missing: run `make setup`"
    # GGML_TEST_THREADS: the patch lets the test set the backend's thread count (default: half the cores)
    proc = subprocess.run([str(BINARY), "test", "-b", "CPU", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "GGML_TEST_THREADS": str(threads)})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    m = re.search(r"(\d+)/(\d+) tests passed", out)
    assert m and m.group(1) == m.group(2), out[-4000:]
    return out, int(m.group(2))


@pytest.mark.parametrize("threads", [1, 3])
def test_turbo_ops_pass_test_backend_ops(threads):
    out, cases = run_cases(["-p", "turbo"], threads)
    assert cases >= 100  # the turbo cases ran (not filtered away)
    for op in ("SET_ROWS", "GET_ROWS", "CPY", "FLASH_ATTN_EXT"):
        assert re.search(rf"{op}\(.*turbo", out), op


@pytest.mark.parametrize("threads", [1, 3])
def test_q4_1_tiled_matmul_matches_vec_dot(threads):
    out, cases = run_cases(["-o", "MUL_MAT", "-p", "type_a=q4_1"], threads)
    assert cases >= 40  # one-row, few-row and prefill shapes (n = 1..16, broadcast, permuted)
    assert re.search(r"MUL_MAT\(type_a=q4_1,type_b=f32,m=16,n=1,", out)
    for n in (1, 2, 3, 5, 13, 17):  # patch 0006's lanes with the 4x4 tiles for the rest, SmolLM2's k
        assert re.search(rf"MUL_MAT\(type_a=q4_1,type_b=f32,m=20,n={n},k=576,", out), n


@pytest.mark.parametrize("threads", [1, 3])
def test_q8_0_vnni_matmul_matches_vec_dot(threads):
    out, cases = run_cases(["-o", "MUL_MAT", "-p", "type_a=q8_0,type_b=f32"], threads)
    assert cases >= 30  # n = 1..16 (the VNNI kernel where the CPU has it), broadcast, permuted, prefill
    assert re.search(r"MUL_MAT\(type_a=q8_0,type_b=f32,m=16,n=1,", out)
    assert re.search(r"MUL_MAT\(type_a=q8_0,type_b=f32,m=\d+,n=509,", out)  # several chunks of rows


# One thread runs the odd verification width only (its blocks end in a partial one): the path is
# the same for every width, and the three threads split rows, blocks and the partial tail (a
# third of the time: 16 s instead of 54 s on 2 cores for the single-thread run).
@pytest.mark.parametrize("threads, widths", [(1, (3,)), (3, (1, 3, 32))])
def test_f16_flash_attention_blocks_match_one_row_path(threads, widths):
    # llama.cpp's own f16 cases: head sizes 40..576, GQA ratios, masks, sinks, ALiBi, softcap,
    # permuted inputs; the decode and verification widths (nb <= 32) that take patch 0003's path
    nbs = "|".join(map(str, widths))
    out, cases = run_cases(["-o", "FLASH_ATTN_EXT", "-p", f"nb=({nbs}),.*type_K=f16,type_V=f16"], threads)
    assert cases >= 200 * len(widths)
    for nb in widths:
        assert re.search(rf"FLASH_ATTN_EXT\(hsk=\d+,hsv=\d+,nh=\d+,nr23=\[4,1\],kv=512,nb={nb},.*type_K=f16", out), nb
