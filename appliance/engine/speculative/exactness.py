"""How many tokens of one sequence a single llama_decode can verify while computing, bit for bit,
the logits that decoding them one at a time computes.

Greedy answers must not change with speculation, but some kernels are not batch-invariant: a
kernel that sums in another order for a batch of several rows gives logits that differ in the
last bits, and a near-tie token can flip. Patch 0004 makes the x86 kernels of both bundled models
invariant under 64 rows; before it, llama.cpp's repacked Q4_K gemm (4 rows on) and its tiled
K-quant kernel (8 rows on) held Gemma 3 270M to 3 rows, and other builds (ARM, GPU) or quant
types may still be variant. Measured once at load on the model's own context (sequence 0,
cleared afterwards): the runner then verifies at most this many tokens (the regular one and its
drafts) per greedy sequence per step.

Whether such a difference reaches the logits depends on the inputs: after one context of 24
tokens Gemma's 4 to 7 rows came out bit-identical, after 64 or 200 they did not, so the probe
takes the smallest width over several context lengths (CONTEXTS).
"""

from __future__ import annotations

import threading

import llama_cpp as lc
import numpy as np

from ...resources import outputs
from ..load_cancel import raise_if_set

CONTEXTS = (24, 200)  # part of the runner's cache key: a change re-measures


# Re-exported: the runner and the tests read it here, next to the probe that measures below it.
BATCH_INVARIANT_ROWS = outputs.BATCH_INVARIANT_ROWS


def exact_rows(ctx: lc.llama_context_p, n_vocab: int, max_rows: int, seq_id: int = 0,
               contexts: tuple[int, ...] = CONTEXTS, cancel: threading.Event | None = None) -> int:
    """The largest w <= max_rows such that, after each of `contexts` tokens of context, every
    batch of w' <= w tokens is exact (at least 1). Raises LoadCancelled before a decode once
    `cancel` is set."""
    width = max_rows
    room = lc.llama_n_ctx_seq(ctx)  # a sequence's positions: context + rows must fit
    for context in contexts:
        context = min(context, room - width)
        if width == 1 or context < 1:
            break
        width = _exact_rows_after(ctx, n_vocab, width, seq_id, context, cancel)
    return width


def _exact_rows_after(ctx: lc.llama_context_p, n_vocab: int, max_rows: int, seq_id: int, context: int,
                      cancel: threading.Event | None) -> int:
    mem = lc.llama_get_memory(ctx)
    tokens = [(7919 * i + 13) % n_vocab for i in range(context + max_rows)]  # arbitrary, fixed
    chunk = max(1, min(context, lc.llama_n_batch(ctx)))
    batch = lc.llama_batch_init(max(chunk, max_rows), 0, 1)

    def decode(start: int, n: int, logits: bool = True) -> list[np.ndarray]:
        raise_if_set(cancel)
        for i in range(n):
            batch.token[i] = tokens[start + i]
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = seq_id
            batch.logits[i] = logits
        batch.n_tokens = n
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed while measuring batch invariance")
        if not logits:
            return []
        return [np.ctypeslib.as_array(lc.llama_get_logits_ith(ctx, i), shape=(n_vocab,)).copy() for i in range(n)]

    try:
        for start in range(0, context, chunk):
            decode(start, min(chunk, context - start), logits=False)
        single = [decode(context + i, 1)[0] for i in range(max_rows)]
        width = 1
        for w in range(2, max_rows + 1):
            lc.llama_memory_seq_rm(mem, seq_id, context, -1)
            rows = decode(context, w)
            if any(not np.array_equal(a, b) for a, b in zip(rows, single)):
                break
            width = w
        return width
    finally:
        lc.llama_memory_seq_rm(mem, seq_id, -1, -1)
        lc.llama_batch_free(batch)
