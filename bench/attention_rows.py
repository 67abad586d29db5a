"""What attention adds to a decode of n rows as the context grows: flash attention on (what EIE
runs) against off, side by side in one run, f16 KV, SmolLM2-135M.

A speculative verification decodes one sequence's regular token and its drafts as n rows. On
the CPU, the flash-attention kernel handles each (query row, head) on its own, so every row reads
the whole KV and the cost of an extra row grows with the context; without flash attention, K·Q is
one matrix product for all rows. Flash attention stays on anyway: without it a decode of several
rows is not batch-invariant (the column "exact rows", speculative/exactness.py), so greedy
speculation would lose its drafts, and quantized KV types need it.

For each context length: llama_decode time of one sequence with n new tokens after that many
tokens of context (logits for every row), both modes alternating, median of the repeats.
Usage: .venv/bin/python bench/attention_rows.py [--contexts 100,500,1500] [--repeats 7] [--threads 2]
Prints a table and writes bench/results/attention_rows.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
ROWS = (1, 2, 4, 5, 8, 12, 17)
MODES = {"on": 1, "off": 0}  # llama_flash_attn_type


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--contexts", default="100,500,1500")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import llama_cpp as lc

    sys.path.insert(0, str(ROOT))
    from appliance.engine import native
    from appliance.engine.speculative.exactness import exact_rows

    native.init_backend()  # loads the CPU backend module as serving does
    model = lc.llama_model_load_from_file(str(MODEL).encode(), lc.llama_model_default_params())
    n_vocab = lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model))
    contexts = [int(c) for c in args.contexts.split(",")]
    tokens = [(7919 * i + 13) % n_vocab for i in range(max(contexts) + max(ROWS))]  # arbitrary, fixed
    batch = lc.llama_batch_init(512, 0, 1)

    def decode(ctx, start: int, n: int) -> None:
        for i in range(n):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = tokens[start + i], start + i, 1, 1
            batch.seq_id[i][0] = 0
        batch.n_tokens = n
        if lc.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")

    ctxs = {}
    for mode, fa in MODES.items():
        cp = lc.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = 2048, 512, 512
        cp.n_threads = cp.n_threads_batch = args.threads
        cp.flash_attn_type = fa
        ctxs[mode] = lc.llama_init_from_model(model, cp)
    exact = {mode: exact_rows(ctx, n_vocab, max(ROWS)) for mode, ctx in ctxs.items()}
    table: dict[str, dict[str, dict[str, float]]] = {}
    for context in contexts:
        times: dict[tuple[str, int], list[float]] = {(m, n): [] for m in MODES for n in ROWS}
        for mode, ctx in ctxs.items():
            lc.llama_memory_seq_rm(lc.llama_get_memory(ctx), 0, -1, -1)
            for start in range(0, context, 512):
                decode(ctx, start, min(512, context - start))
        for rep in range(args.repeats):
            for n in ROWS:
                for mode in (MODES if rep % 2 == 0 else reversed(list(MODES))):
                    ctx = ctxs[mode]
                    t0 = time.perf_counter()
                    decode(ctx, context, n)
                    times[(mode, n)].append((time.perf_counter() - t0) * 1000)
                    lc.llama_memory_seq_rm(lc.llama_get_memory(ctx), 0, context, -1)
        table[str(context)] = {mode: {str(n): round(statistics.median(times[(mode, n)]), 2) for n in ROWS}
                               for mode in MODES}
    for ctx in ctxs.values():
        lc.llama_free(ctx)
    lc.llama_batch_free(batch)
    lc.llama_model_free(model)

    print(f"\n| context | flash attention | exact rows | {' | '.join(f'{n} rows' for n in ROWS)} |")
    print("|---|---|---|" + "---|" * len(ROWS))
    for context, by_mode in table.items():
        for mode, ms in by_mode.items():
            print(f"| {context} | {mode} | {exact[mode]} | {' | '.join(f'{ms[str(n)]:.1f}' for n in ROWS)} |")
    out = ROOT / "bench" / "results" / "attention_rows.json"
    out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "model": MODEL.name, "kv": "f16",
                               "threads": args.threads, "repeats": args.repeats, "exact_rows": exact,
                               "median_ms": table}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
