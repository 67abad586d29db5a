"""The exactness probe (engine/speculative/exactness.py) on the real models: the width it reports
holds at a context it never probed (a batch of that many rows gives, bit for bit, the logits of
one-row decodes), and it finds all 17 rows on both models. Gemma was held to 3 before patch 0004
(its repacked Q4_K gemm summed in another order from 4 rows on, llama.cpp's tiled K-quant kernel
takes over from 8) and probing at one context length was not enough with centred keys (after 24
tokens, 4 to 7 rows happened to come out identical)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import llama_cpp as lc

from appliance.engine import native
from appliance.engine.speculative.exactness import BATCH_INVARIANT_ROWS, exact_rows
from conftest import GEMMA3, SMOLLM2


def logits_after(m: native.LoadedModel, tokens: list[int], context: int, width: int) -> tuple[list, list]:
    """Logits of tokens[context:context+width] decoded one by one, and decoded as one batch."""
    mem = lc.llama_get_memory(m.ctx)
    batch = lc.llama_batch_init(max(context, width), 0, 1)

    def decode(start: int, n: int) -> list[np.ndarray]:
        for i in range(n):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tokens[start + i], start + i, 1, 1
            batch.seq_id[i][0] = 0
        batch.n_tokens = n
        assert lc.llama_decode(m.ctx, batch) == 0
        return [np.ctypeslib.as_array(lc.llama_get_logits_ith(m.ctx, i), shape=(m.n_vocab,)).copy() for i in range(n)]

    try:
        lc.llama_memory_seq_rm(mem, 0, -1, -1)
        decode(0, context)
        single = [decode(context + i, 1)[0] for i in range(width)]
        lc.llama_memory_seq_rm(mem, 0, context, -1)
        return single, decode(context, width)
    finally:
        lc.llama_memory_seq_rm(mem, 0, -1, -1)
        lc.llama_batch_free(batch)


@pytest.mark.parametrize("path,center,expected", [(SMOLLM2, True, 17), (GEMMA3, False, 17), (GEMMA3, True, 17)],
                         ids=["smollm2", "gemma3", "gemma3-centred"])
def test_probed_width_is_exact_elsewhere(real_models, tmp_path: Path, path: Path, center: bool, expected: int):
    m = native.load(path, n_ctx_total=2048, n_seq_max=1, n_batch=512, n_threads=2, type_k="f16", type_v="f16",
                    flash_attn="on", center_k=center, cache_dir=tmp_path)
    try:
        width = exact_rows(m.ctx, m.n_vocab, 17)
        assert width == expected
        tokens = [(104729 * i + 7) % m.n_vocab for i in range(460)]  # not the probe's tokens
        single, batched = logits_after(m, tokens, 437, width)
        assert all(np.array_equal(a, b) for a, b in zip(single, batched))
    finally:
        m.free()


def test_probe_fits_a_small_context(real_models, tmp_path: Path):
    # n_ctx 256 (the smallest allowed) with max_draft 64: 200 tokens of context + 65 rows would not fit
    m = native.load(SMOLLM2, n_ctx_total=256, n_seq_max=1, n_batch=256, n_threads=2, type_k="f16", type_v="f16",
                    flash_attn="on")
    try:
        assert exact_rows(m.ctx, m.n_vocab, 65) >= 17
    finally:
        m.free()


@pytest.mark.parametrize("path", [SMOLLM2, GEMMA3], ids=["smollm2", "gemma3"])
def test_steps_up_to_the_invariant_bound_are_exact(real_models, tmp_path: Path, path: Path):
    """The runner lets a step with drafts have up to BATCH_INVARIANT_ROWS - 1 rows (several
    sequences verifying together); with an f16 KV cache, 33 rows and more had left the blocked
    flash attention's chunked path for llama.cpp's tiled one, which sums in another order (patch 0014)."""
    m = native.load(path, n_ctx_total=2048, n_seq_max=1, n_batch=512, n_threads=2, type_k="f16", type_v="f16",
                    flash_attn="on", cache_dir=tmp_path)
    try:
        tokens = [(7907 * i + 3) % m.n_vocab for i in range(280 + BATCH_INVARIANT_ROWS)]
        for width in (33, 48, BATCH_INVARIANT_ROWS - 1):
            single, batched = logits_after(m, tokens, 280, width)
            assert all(np.array_equal(a, b) for a, b in zip(single, batched)), width
    finally:
        m.free()
