"""Patch 0008 (compute graphs kept by ubatch shape) on real models: decodes whose widths change
from step to step, as speculative verification makes them, give bit-identical logits whether a
kept graph is allocated again or every change of width rebuilds the graph, and the kept graphs
are what the decodes use."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import llama_cpp as lc

from appliance.engine import native
from conftest import GEMMA3, SMOLLM2

TEXT = Path("/usr/share/common-licenses/GPL-3").read_text()
CONTEXT = 200
WIDTHS = [1, 3, 1, 1, 5, 3, 1, 3, 5, 1] * 3  # one-row steps and verifications of 2 or 4 drafts


def decode_widths(path: Path, keep: int, monkeypatch: pytest.MonkeyPatch) -> tuple[np.ndarray, int]:
    """Every row's logits over WIDTHS after a CONTEXT-token prompt, and the graphs reused."""
    monkeypatch.setenv("LLAMA_GRAPH_KEEP", str(keep))  # read when the context is made
    m = native.load(path, n_ctx_total=1024, n_seq_max=1, n_batch=CONTEXT, n_threads=2,
                    type_k="f16", type_v="f16", flash_attn="on")
    batch = lc.llama_batch_init(CONTEXT, 0, 1)
    try:
        tokens = native.Vocab(m.vocab, m.n_vocab).tokenize(TEXT, add_special=True, parse_special=False)

        def decode(pos: int, n: int) -> np.ndarray:
            for i in range(n):
                batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tokens[pos + i], pos + i, 1, 1
                batch.seq_id[i][0] = 0
            batch.n_tokens = n
            assert lc.llama_decode(m.ctx, batch) == 0
            return np.ctypeslib.as_array(lc.llama_get_logits(m.ctx), shape=(n, m.n_vocab)).copy()

        decode(0, CONTEXT)
        rows, pos = [], CONTEXT
        for width in WIDTHS:
            rows.append(decode(pos, width))
            lc.llama_memory_seq_rm(lc.llama_get_memory(m.ctx), 0, pos + 1, -1)  # a step that accepted no draft
            pos += 1
        return np.concatenate(rows), lc.llama_perf_context(m.ctx).n_reused
    finally:
        lc.llama_batch_free(batch)
        m.free()


@pytest.mark.parametrize("path", [SMOLLM2, GEMMA3], ids=["smollm2", "gemma3"])
def test_kept_graphs_compute_what_rebuilt_graphs_compute(path, monkeypatch):
    rebuilt, reused_last_only = decode_widths(path, 1, monkeypatch)
    kept, reused_kept = decode_widths(path, 4, monkeypatch)
    assert np.array_equal(kept, rebuilt)
    # with the last graph only, a graph is reused where two decodes in a row have one width (5
    # times here); with kept graphs, every decode after the first of each width (27 of 30)
    assert reused_last_only <= 5
    assert reused_kept >= len(WIDTHS) - 3
