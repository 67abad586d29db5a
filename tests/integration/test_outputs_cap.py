"""llama.cpp's n_outputs_max (resources/outputs.py): the compute buffer holds the logits of the rows
one decode asks for, not of a whole ubatch, and a decode of that many rows computes the same logits,
bit for bit, as in a context that reserved a whole ubatch of them."""

from __future__ import annotations

import numpy as np
import pytest

import llama_cpp as lc

from appliance.engine import native
from conftest import GEMMA3, SMOLLM2

MIB = 1 << 20
ROWS = 8


def _rows_after_prompt(m: native.LoadedModel, prompt: int) -> list[np.ndarray]:
    """The logits of ROWS tokens decoded as one batch after a prompt whose logits are not asked for."""
    tokens = [(7919 * i + 11) % m.n_vocab for i in range(prompt + ROWS)]
    batch = lc.llama_batch_init(prompt + ROWS, 0, 1)
    try:
        for start, n, logits in ((0, prompt, 0), (prompt, ROWS, 1)):
            for i in range(n):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tokens[start + i], start + i, 1, logits
                batch.seq_id[i][0] = 0
            batch.n_tokens = n
            assert lc.llama_decode(m.ctx, batch) == 0
        return [np.ctypeslib.as_array(lc.llama_get_logits_ith(m.ctx, i), shape=(m.n_vocab,)).copy()
                for i in range(ROWS)]
    finally:
        lc.llama_memory_seq_rm(lc.llama_get_memory(m.ctx), 0, -1, -1)
        lc.llama_batch_free(batch)


@pytest.mark.parametrize("path", [SMOLLM2, GEMMA3], ids=["smollm2", "gemma3"])
def test_the_compute_buffer_holds_the_rows_asked_for_and_they_compute_the_same(real_models, path):
    def load(**kw) -> native.LoadedModel:
        return native.load(path, n_ctx_total=1024, n_seq_max=2, n_batch=512, n_threads=2, type_k="f16",
                           type_v="f16", flash_attn="on", **kw)

    whole = load()
    try:
        whole_compute, expected = whole.buffers.compute, _rows_after_prompt(whole, 100)
    finally:
        whole.free()
    capped = load(n_outputs_max=ROWS)
    try:
        # 512 rows of logits reserved against 8: most of (512 - 8) × n_vocab floats less (the allocator
        # shares the rest of the buffer between tensors that do not live at the same time)
        saved = whole_compute - capped.buffers.compute
        assert saved >= 0.8 * (512 - ROWS) * capped.n_vocab * 4, (whole_compute / MIB, capped.buffers.compute / MIB)
        rows = _rows_after_prompt(capped, 100)
        assert all(np.array_equal(a, b) for a, b in zip(expected, rows))
    finally:
        capped.free()
