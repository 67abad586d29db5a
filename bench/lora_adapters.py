"""LoRA adapters on one model against the same fine-tunes served as separate models, side by side.

Writes three random rank-8 f16 adapters for SmolLM2 (q, v and up projections; tests/lora_adapter.py),
then runs, alternating per repeat, 8 concurrent greedy chat streams of --max-tokens each on:

- adapters: one `smollm2` (8 slots) serving `smollm2` and its adapters `tuned-1..3`, 2 streams each
  (each step decodes one adapter set: models[].lora);
- one set: the same server, all 8 streams on `smollm2` (one decode per step: the bound);
- adapters, turns off: the same as `adapters` on a server started with EIE_ADAPTER_TURNS=0, whose
  sets change at every step (engine/adapter_turns.py: a set otherwise keeps the context until
  the scheduler reserve a change costs is a quarter of its turn);
- copies: four models from the same GGUF (2 slots each), 2 streams each: what four fine-tunes cost
  as separate models (a merged fine-tune has the same shapes, so the same bytes and speed).

Reports aggregate completion tokens/s (median), and the memory each server's models are charged
(/v1/admin/vram/status total_bytes) with the process's resident set. Writes
bench/results/lora_adapters.json.

    .venv/bin/python bench/lora_adapters.py [--repeats 5] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from eie_server import EieServer

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from lora_adapter import write_lora  # noqa: E402

MODEL = ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
QUESTIONS = ["Write a short paragraph about lighthouses.", "Describe a walk in the forest.",
             "Explain how bread is made.", "Tell a story about a small boat."]


def adapters_config(adapters: list[Path], threads: int) -> dict:
    return {"models": [{"name": "smollm2", "path": str(MODEL), "n_ctx": 1024, "n_parallel": 8, "threads": threads,
                        "lora": [{"name": f"tuned-{i + 1}", "path": str(p)} for i, p in enumerate(adapters)]}]}


def copies_config(threads: int) -> dict:
    return {"models": [{"name": n, "path": str(MODEL), "n_ctx": 1024, "n_parallel": 2, "threads": threads}
                       for n in ("smollm2", "tuned-1", "tuned-2", "tuned-3")]}


def streams(base: str, models: list[str], max_tokens: int) -> tuple[float, int]:
    """All requests at once; (wall seconds, completion tokens)."""
    def one(i: int) -> int:
        r = httpx.post(base + "/v1/chat/completions", timeout=600, json={
            "model": models[i], "messages": [{"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]}],
            "max_tokens": max_tokens, "temperature": 0, "logit_bias": {"2": -100}})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["completion_tokens"]

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(models)) as pool:
        tokens = sum(pool.map(one, range(len(models))))
    return time.perf_counter() - t0, tokens


def memory(base: str) -> dict:
    status = httpx.get(base + "/v1/admin/vram/status", timeout=30).json()
    return {"models_total_bytes": sum(m["total_bytes"] for m in status["models"]),
            "lora_adapter_bytes": sum(m["lora_adapter_bytes"] for m in status["models"]),
            "rss_bytes": status["process"]["rss_bytes"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lora_adapters.json")
    args = ap.parse_args(argv)
    mixed = [m for m in ("smollm2", "tuned-1", "tuned-2", "tuned-3") for _ in range(2)]
    runs: dict[str, list[float]] = {"adapters": [], "adapters, turns off": [], "one set": [], "copies": []}
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        adapters = [d / f"tuned-{i}.gguf" for i in (1, 2, 3)]
        for i, p in enumerate(adapters):
            write_lora(MODEL, p, rank=8, seed=i + 1, strength=0.3)
        (d / "a").mkdir()
        (d / "c").mkdir()
        (d / "n").mkdir()
        one = EieServer(adapters_config(adapters, args.threads), d / "a", 180, args=("--log-level", "warning"))
        no_turns = EieServer(adapters_config(adapters, args.threads), d / "n", 180, args=("--log-level", "warning"),
                             env={**os.environ, "EIE_ADAPTER_TURNS": "0"})
        copies = EieServer(copies_config(args.threads), d / "c", 180, args=("--log-level", "warning"))
        try:
            plans = [("adapters", one, mixed), ("adapters, turns off", no_turns, mixed),
                     ("one set", one, ["smollm2"] * 8), ("copies", copies, mixed)]
            for _, srv, models in plans:  # warm-up
                streams(srv.base, models, 8)
            for i in range(args.repeats):
                for label, srv, models in (plans if i % 2 == 0 else plans[::-1]):
                    wall, tokens = streams(srv.base, models, args.max_tokens)
                    runs[label].append(tokens / wall)
            mem = {"adapters": memory(one.base), "copies": memory(copies.base)}
            switches = {label: httpx.get(srv.base + "/v1/admin/scheduling/status").json()["models"]["smollm2"]
                        ["adapter_switches"] for label, srv in (("turns", one), ("turns off", no_turns))}
        finally:
            one.stop()
            no_turns.stop()
            copies.stop()

    med = {k: statistics.median(v) for k, v in runs.items()}
    result = {
        "benchmark": "lora_adapters",
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cores": os.cpu_count(), "threads": args.threads, "max_tokens": args.max_tokens, "repeats": args.repeats,
        "streams": 8, "adapter": "rank 8, f16, attn_q attn_v ffn_up, SmolLM2-135M Q4_1",
        "tokens_per_s": {k: {"median": med[k], "runs": v} for k, v in runs.items()},
        "memory": mem, "adapter_switches": switches,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    mib = 1 << 20
    print(f"{'8 streams':<46}{'tok/s':>8}{'models MiB':>12}{'RSS MiB':>10}")
    print(f"{'model + 3 adapters, 2 streams per set':<46}{med['adapters']:>8.1f}"
          f"{mem['adapters']['models_total_bytes'] / mib:>12.1f}{mem['adapters']['rss_bytes'] / mib:>10.1f}")
    print(f"{'the same, turns off (a change every step)':<46}{med['adapters, turns off']:>8.1f}")
    print(f"{'model + 3 adapters, all streams on the model':<46}{med['one set']:>8.1f}")
    print(f"{'4 separate models, 2 streams each':<46}{med['copies']:>8.1f}"
          f"{mem['copies']['models_total_bytes'] / mib:>12.1f}{mem['copies']['rss_bytes'] / mib:>10.1f}")
    print(f"adapter bytes: {mem['adapters']['lora_adapter_bytes']}; adapter switches: {switches['turns']} "
          f"(turns off: {switches['turns off']})")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
