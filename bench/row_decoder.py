"""A timed llama_decode of n rows of one sequence (SmolLM2-135M unless told), loaded as serving
loads it (the CPU backend module through appliance.engine.native): shared by the kernel benches
(row_costs.py, attention_rows.py), which run it in child processes, one per kernel setting."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"


class RowDecoder:
    """One model, one context (sequence 0); decode() returns the llama_decode time in ms."""

    def __init__(self, threads: int, flash_attn: int = -1, n_ctx: int = 2048, model: Path = MODEL) -> None:
        import llama_cpp as lc

        sys.path.insert(0, str(ROOT))
        from appliance.engine import native

        native.init_backend()
        self.lc = lc
        mp = lc.llama_model_default_params()
        # weights kept in the file's layout: no AMX or CPU_REPACK copies (bench/amx_rows.py's peer)
        mp.use_extra_bufts = os.environ.get("EIE_BENCH_NO_EXTRA_BUFTS") != "1"
        self.model = lc.llama_model_load_from_file(str(model).encode(), mp)
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, 512, 512
        cp.n_threads = cp.n_threads_batch = threads
        cp.flash_attn_type = flash_attn  # -1 auto (on for the CPU), 0 off, 1 on
        self.ctx = lc.llama_init_from_model(self.model, cp)
        self.mem = lc.llama_get_memory(self.ctx)
        self.n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model))

    def decode(self, tokens: list[int], pos0: int) -> float:
        lc = self.lc
        b = lc.llama_batch_init(len(tokens), 0, 1)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos0 + i, 1, 1
            b.seq_id[i][0] = 0
        b.n_tokens = len(tokens)
        t0 = time.perf_counter()
        rc = lc.llama_decode(self.ctx, b)
        dt = time.perf_counter() - t0
        lc.llama_batch_free(b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        return dt * 1000

    def prefill(self, tokens: list[int]) -> None:
        """Clear the sequence and decode `tokens` from position 0 in batches of 512."""
        self.truncate(0)
        for start in range(0, len(tokens), 512):
            self.decode(tokens[start:start + 512], start)

    def truncate(self, length: int) -> None:
        self.lc.llama_memory_seq_rm(self.mem, 0, length, -1)

    def close(self) -> None:
        self.lc.llama_free(self.ctx)
        self.lc.llama_model_free(self.model)
