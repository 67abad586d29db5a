"""llama_decode under the process core budget: never more busy ggml threads than cores (ggml's
threads spin), shared by the runners, the draft models and the K-centring calibration."""

from __future__ import annotations

import llama_cpp as lc

from ..resources.cores import CoreBudget


def decode_with_cores(ctx: lc.llama_context_p, batch: lc.llama_batch, cores: CoreBudget | None, want: int,
                      threads_set: int) -> tuple[int, int]:
    """llama_decode with its threads taken from `cores` (all `want` when None). Returns
    llama_decode's result and the thread count now set on `ctx`."""
    granted = cores.acquire(want) if cores is not None else want
    try:
        if granted != threads_set:
            lc.llama_set_n_threads(ctx, granted, granted)
            threads_set = granted
        return lc.llama_decode(ctx, batch), threads_set
    finally:
        if cores is not None:
            cores.release(granted)
