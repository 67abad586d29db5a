"""KV cache types side by side: decode speed at a long context, and live migration between types.

Speed: for each model and KV type, one sequence reads 2,048 tokens of real English text (the GNU
GPL v3 from /usr/share/common-licenses), then decodes greedily; the decode rate (tokens/s) is
the median of several repeats, all types measured in the same run with the same threads.

Migration: 4 live sequences of 1,000 tokens each are moved from a context of the source type to
a new context of the target type by converting their states (appliance.kv.migrate), and the
same 4 sequences are prefilled again into a fresh context of the target type; both are timed.
Right after, the next tokens of each sequence are read in the migrated context, the re-prefilled
one and an f16 one, and the KL divergence of the next-token distributions is reported:
migrated vs re-prefilled, next to the target type's own KLD against f16.
Every context runs as the server runs it by default, with K centring (engine/k_centering.py).

    .venv/bin/python bench/kv_speed.py [--model all] [--types f16,q8_0,q4_0,turbo4,turbo3,turbo2]
Prints tables and writes bench/results/kv_speed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import llama_cpp as lc  # noqa: E402

from appliance.engine import native  # noqa: E402
from appliance.kv import migrate  # noqa: E402
from kv_quality import log_softmax  # noqa: E402  (the same measure of distance as the quality bench)

TEXT = Path("/usr/share/common-licenses/GPL-3")
MODELS = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}
CHUNK = 256
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "eie"  # measured K means


def kv_pair(kv: str) -> tuple[str, str]:
    k, _, v = kv.partition("/")
    return k, v or k


class Context:
    """One model context with `n_seq` sequences, fed chunk by chunk."""

    def __init__(self, path: Path, kv: str, n_ctx: int, n_seq: int, threads: int):
        k, v = kv_pair(kv)
        self.m = native.load(path, n_ctx_total=n_ctx * n_seq, n_seq_max=n_seq, n_batch=CHUNK,
                             n_threads=threads, type_k=k, type_v=v, flash_attn="on", center_k=True,
                             cache_dir=CACHE)
        self.batch = lc.llama_batch_init(CHUNK, 0, 1)
        self.pos = [0] * n_seq

    def feed(self, seq: int, tokens: list[int], logits: bool = False) -> np.ndarray | None:
        out = []
        for start in range(0, len(tokens), CHUNK):
            chunk = tokens[start : start + CHUNK]
            b = self.batch
            for i, t in enumerate(chunk):
                b.token[i], b.pos[i], b.n_seq_id[i] = t, self.pos[seq] + i, 1
                b.logits[i] = 1 if logits else int(i == len(chunk) - 1)
                b.seq_id[i][0] = seq
            b.n_tokens = len(chunk)
            if lc.llama_decode(self.m.ctx, b) != 0:
                raise RuntimeError("llama_decode failed")
            self.pos[seq] += len(chunk)
            if logits:
                ptr = lc.llama_get_logits(self.m.ctx)
                out.append(np.ctypeslib.as_array(ptr, shape=(len(chunk), self.m.n_vocab)).copy())
        return np.concatenate(out) if logits else None

    def last_logits(self) -> np.ndarray:
        return np.ctypeslib.as_array(lc.llama_get_logits_ith(self.m.ctx, -1), shape=(self.m.n_vocab,))

    def close(self) -> None:
        lc.llama_batch_free(self.batch)
        self.m.free()


def kld(ref_logits: np.ndarray, got_logits: np.ndarray) -> float:
    ref, got = log_softmax(ref_logits), log_softmax(got_logits)
    return float((np.exp(ref) * (ref - got)).sum(axis=-1).mean())


def text_tokens(path: Path, threads: int) -> list[int]:
    ctx = Context(path, "f16", 512, 1, threads)
    vocab = native.Vocab(ctx.m.vocab, ctx.m.n_vocab)
    tokens = vocab.tokenize(TEXT.read_text(), add_special=True, parse_special=False)
    ctx.close()
    return tokens


def decode_rate(path: Path, kv: str, tokens: list[int], n_context: int, n_decode: int, threads: int) -> float:
    ctx = Context(path, kv, n_context + n_decode + 64, 1, threads)
    ctx.feed(0, tokens[:n_context])
    tok = int(np.argmax(ctx.last_logits()))
    t0 = time.perf_counter()
    for _ in range(n_decode):
        ctx.feed(0, [tok])
        tok = int(np.argmax(ctx.last_logits()))
    rate = n_decode / (time.perf_counter() - t0)
    ctx.close()
    return rate


def speed(model: str, types: list[str], tokens: list[int], args: argparse.Namespace) -> list[dict]:
    path = ROOT / "models" / MODELS[model]
    rates: dict[str, list[float]] = {t: [] for t in types}
    for _ in range(args.repeats):  # interleaved, so drift affects every type alike
        for t in types:
            rates[t].append(decode_rate(path, t, tokens, args.context, args.decode, args.threads))
    return [{"model": model, "kv": t, "context": args.context, "decode_tok_s": statistics.median(r),
             "repeats": r} for t, r in rates.items()]


def migration(model: str, source: str, target: str, tokens: list[int], args: argparse.Namespace) -> dict:
    path = ROOT / "models" / MODELS[model]
    n_seq, n_tok, n_next = 4, args.migrate_tokens, 64
    n_ctx = n_tok + n_next + 256
    prompts = [tokens[i * 211 : i * 211 + n_tok] for i in range(n_seq)]
    nexts = [tokens[i * 211 + n_tok : i * 211 + n_tok + n_next] for i in range(n_seq)]
    src = Context(path, source, n_ctx, n_seq, args.threads)
    for s in range(n_seq):
        src.feed(s, prompts[s])
    meta = src.m.metadata
    tk, tv = kv_pair(target)

    migrated = Context(path, target, n_ctx, n_seq, args.threads)
    t0 = time.perf_counter()
    migrate.migrate(src.m.ctx, migrated.m.ctx, range(n_seq), type_k=tk, type_v=tv, rot=migrate.rotation_sizes(meta))
    migrate_s = time.perf_counter() - t0
    migrated.pos = list(src.pos)
    src.close()

    fresh = Context(path, target, n_ctx, n_seq, args.threads)
    t0 = time.perf_counter()
    for s in range(n_seq):
        fresh.feed(s, prompts[s])
    prefill_s = time.perf_counter() - t0

    ref = Context(path, "f16", n_ctx, n_seq, args.threads)
    for s in range(n_seq):
        ref.feed(s, prompts[s])
    k_mig, k_target = [], []
    for s in range(n_seq):
        a = migrated.feed(s, nexts[s], logits=True)
        b = fresh.feed(s, nexts[s], logits=True)
        r = ref.feed(s, nexts[s], logits=True)
        k_mig.append(kld(b, a))
        k_target.append(kld(r, b))
    for c in (migrated, fresh, ref):
        c.close()
    kld_mig, kld_target = float(np.mean(k_mig)), float(np.mean(k_target))
    return {"model": model, "from": source, "to": target, "sequences": n_seq, "tokens_each": n_tok,
            "migrate_s": migrate_s, "reprefill_s": prefill_s, "speedup": prefill_s / migrate_s,
            "kld_migrated_vs_target": kld_mig, "kld_target_vs_f16": kld_target,
            "kld_ratio": kld_mig / kld_target if kld_target else float("inf")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="all", choices=["all", *MODELS])
    ap.add_argument("--types", default="f16,q8_0,q4_0,turbo4,turbo3,turbo2")
    ap.add_argument("--context", type=int, default=2048)
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--migrations", default="f16>turbo3,q8_0>turbo3,turbo3>turbo2")
    ap.add_argument("--migrate-tokens", type=int, default=1000)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "kv_speed.json")
    args = ap.parse_args(argv)
    native.init_backend()
    models = list(MODELS) if args.model == "all" else [args.model]
    speed_rows, mig_rows = [], []
    for m in models:
        tokens = text_tokens(ROOT / "models" / MODELS[m], args.threads)
        speed_rows += speed(m, args.types.split(","), tokens, args)
        for pair in filter(None, args.migrations.split(",")):
            source, _, target = pair.partition(">")
            mig_rows.append(migration(m, source, target, tokens, args))

    print(f"\ndecode at {args.context} tokens of context, {args.threads} threads, median of {args.repeats}")
    header = f"{'model':<14}{'kv':<8}{'tok/s':>8}{'vs f16':>8}{'vs q4_0':>9}"
    print(header + "\n" + "-" * len(header))
    for r in speed_rows:
        base = {x["kv"]: x["decode_tok_s"] for x in speed_rows if x["model"] == r["model"]}
        f16, q4 = base.get("f16"), base.get("q4_0")
        r["vs_f16"] = r["decode_tok_s"] / f16 if f16 else None
        r["vs_q4_0"] = r["decode_tok_s"] / q4 if q4 else None
        print(f"{r['model']:<14}{r['kv']:<8}{r['decode_tok_s']:>8.1f}{r['vs_f16'] or 0:>8.2f}{r['vs_q4_0'] or 0:>9.2f}")
    print(f"\nmigration of 4 sequences x {args.migrate_tokens} tokens")
    header = f"{'model':<14}{'from>to':<16}{'migrate s':>10}{'re-prefill s':>13}{'KLD mig/target':>16}{'target/f16':>12}"
    print(header + "\n" + "-" * len(header))
    for r in mig_rows:
        print(f"{r['model']:<14}{r['from'] + '>' + r['to']:<16}{r['migrate_s']:>10.3f}{r['reprefill_s']:>13.3f}"
              f"{r['kld_migrated_vs_target']:>16.5f}{r['kld_target_vs_f16']:>12.5f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "kv_speed", "threads": args.threads,
                                    "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                    "speed": speed_rows, "migration": mig_rows}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
