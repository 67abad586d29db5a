"""Patch 0008 (compute graphs kept by ubatch shape) on real models: decodes whose widths change
from step to step, as speculative verification makes them, give bit-identical logits whether a
kept graph is allocated again or every change of width rebuilds the graph, and the kept graphs
are what the decodes use. A context with a GPU backend beside the CPU keeps the last graph alone
(allocating a kept graph again there made CUDA read freed memory on an H200): on a GPU host
(bench/cuda_check.sh serve runs this file) the same decodes, whole on the GPU and split between
GPU and CPU, reuse only the last graph and give what rebuilt graphs give."""

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


class SplitModel:
    """Half the layers on the GPU, the KV cache and attention on the CPU (offload_kqv off)."""

    def __init__(self, path: Path):
        mparams = lc.llama_model_default_params()
        mparams.n_gpu_layers = 15
        self.model = lc.llama_model_load_from_file(str(path).encode(), mparams)
        cparams = lc.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = 1024, CONTEXT, CONTEXT
        cparams.n_threads = cparams.n_threads_batch = 2
        cparams.offload_kqv = False
        self.ctx = lc.llama_init_from_model(self.model, cparams)
        self.vocab = lc.llama_model_get_vocab(self.model)
        self.n_vocab = lc.llama_vocab_n_tokens(self.vocab)

    def free(self) -> None:
        lc.llama_free(self.ctx)
        lc.llama_model_free(self.model)


def decode_widths(path: Path, keep: int, monkeypatch: pytest.MonkeyPatch, split: bool = False) -> tuple[np.ndarray, int]:
    """Every row's logits over WIDTHS after a CONTEXT-token prompt, and the graphs reused."""
    monkeypatch.setenv("LLAMA_GRAPH_KEEP", str(keep))  # read when the context is made
    if split:
        m = SplitModel(path)
    else:
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


# with the last graph only, a graph is reused where two decodes in a row have one width (5 times
# here); with kept graphs, every decode after the first of each width (27 of 30)
LAST_ONLY_REUSES = 5
KEPT_REUSES = len(WIDTHS) - 3


@pytest.mark.parametrize("path", [SMOLLM2, GEMMA3], ids=["smollm2", "gemma3"])
def test_kept_graphs_compute_what_rebuilt_graphs_compute(path, monkeypatch):
    native.init_backend()
    rebuilt, reused_last_only = decode_widths(path, 1, monkeypatch)
    kept, reused_kept = decode_widths(path, 4, monkeypatch)
    assert np.array_equal(kept, rebuilt)
    assert reused_last_only <= LAST_ONLY_REUSES
    if lc.llama_supports_gpu_offload():  # a GPU backend beside the CPU: the last graph alone
        assert reused_kept <= LAST_ONLY_REUSES
    else:
        assert reused_kept >= KEPT_REUSES


def test_with_layers_split_between_gpu_and_cpu_the_last_graph_alone_is_kept(monkeypatch):
    native.init_backend()
    if not lc.llama_supports_gpu_offload():
        pytest.skip("needs a GPU backend and device (bench/cuda_check.sh serve runs it)")
    rebuilt, _ = decode_widths(SMOLLM2, 1, monkeypatch, split=True)
    kept, reused_kept = decode_widths(SMOLLM2, 4, monkeypatch, split=True)
    assert np.array_equal(kept, rebuilt)
    assert reused_kept <= LAST_ONLY_REUSES
