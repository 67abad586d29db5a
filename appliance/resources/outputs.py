"""How many logits rows one `llama_decode` of a model's context asks for at most: llama.cpp's
`n_outputs_max`, which sizes the compute buffer.

llama.cpp reserves its compute buffer for the worst graph, and by default that is a ubatch whose
every token wants logits: n_batch × n_vocab floats (512 MiB for Gemma 3's 262k vocabulary at
n_batch 512, against 426 MiB of weights). A runner asks for far fewer: one row per decoding
sequence, one for a prompt chunk's last token, and with speculative decoding the drafts that one
step verifies (kept under BATCH_INVARIANT_ROWS in all, engine/runner.py) or the exactness probe's
max_draft + 1 rows, and where a model's `scoring_rows` asks for more, that many (a scored prompt's
chunk keeps one row per token). A batch with more outputs than `n_outputs_max` aborts the process in
llama.cpp (an assertion), so every decode is built within `max_outputs`.
"""

from __future__ import annotations

import os

from ..config import ModelConfig


def _invariant_rows(value: str | None) -> int:
    """EIE_BATCH_INVARIANT_ROWS as the kernel reads it: a positive integer, else 64 (a value that
    atoi reads otherwise, such as "32abc", is not honoured here)."""
    try:
        rows = int(value or "")
    except ValueError:
        return 64
    return rows if rows > 0 else 64


# Patch 0004 keeps llama.cpp's tiled K-quant kernel (which sums in another order) for batches of
# this many rows and more; the runner keeps a decode step with drafts under it, so concurrent
# speculating sequences also verify exactly. The kernel reads the same variable.
BATCH_INVARIANT_ROWS = _invariant_rows(os.environ.get("EIE_BATCH_INVARIANT_ROWS"))


def batch_cap(cfg: ModelConfig) -> int:
    """Tokens in one decode of the model's context (llama.cpp's n_batch and n_ubatch)."""
    return max(cfg.n_batch, cfg.n_parallel)


def kv_cells(cfg: ModelConfig) -> int:
    """KV cells of the model's context: n_ctx per sequence; an embedding model's decodes are
    independent (each clears its sequences after pooling), so it holds one decode's tokens."""
    return batch_cap(cfg) if cfg.embedding else cfg.n_ctx * cfg.n_parallel


def max_outputs(cfg: ModelConfig) -> int:
    """The most logits rows one decode of the model's context asks for (at least n_parallel,
    which llama.cpp requires)."""
    if cfg.embedding:  # pooling makes every token of a decode an output
        return batch_cap(cfg)
    spec = cfg.speculative
    rows = cfg.n_parallel
    if spec.sources:
        step = min(BATCH_INVARIANT_ROWS - 1, cfg.n_parallel * (1 + spec.max_draft))
        rows = max(rows, step, spec.max_draft + 1)
    # a scored prompt's chunk keeps a row per token (engine/runner.py)
    return min(batch_cap(cfg), max(rows, cfg.scoring_rows))
