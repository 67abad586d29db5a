"""Prefix cache side by side: time to first token with a 2,000-token prefix cold, in the RAM
tier, and only on disk after a server restart; and the throughput of 200 requests sharing 5
system prompts with and without the cache.

The prefixes are real English text (the GNU GPL v3 from /usr/share/common-licenses), a
different slice for every repeat so each cold run is really cold. Each server is a real
`eie serve` process on loopback; TTFT is the time from sending a streamed chat request to its
first content chunk.

    .venv/bin/python bench/prefix_cache.py [--model gemma3-270m] [--repeats 3] [--requests 200]
Prints tables and writes bench/results/prefix_cache.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from eie_server import EieServer

ROOT = Path(__file__).resolve().parent.parent
TEXT = Path("/usr/share/common-licenses/GPL-3").read_text()
MODELS = {"smollm2-135m": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3-270m": "gemma-3-270m-q4_k_m.gguf"}


class Server(EieServer):
    def __init__(self, model: str, state: Path, prefix: bool, threads: int):
        super().__init__({"server": {"state_dir": str(state), "cache_dir": str(state)},
                          "models": [{"name": "m", "path": str(ROOT / "models" / MODELS[model]), "n_ctx": 4096,
                                      "n_parallel": 4, "threads": threads,
                                      "kv_cache": {"prefix": {"enabled": prefix}}}]}, state, start_timeout=120)


def ttft(base: str, system: str, question: str) -> float:
    body = {"model": "m", "stream": True, "max_tokens": 4, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}]}
    t0 = time.perf_counter()
    with httpx.stream("POST", base + "/v1/chat/completions", json=body, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: ") and '"content"' in line:
                return time.perf_counter() - t0
    raise RuntimeError("no content chunk")


def prefix_text(n_tokens: int, offset: int) -> str:
    # about 4.2 characters per token for this text with both tokenizers
    return "Answer from this text.\n\n" + TEXT[offset : offset + int(n_tokens * 4.2)]


def measure_ttft(model: str, repeats: int, threads: int, tokens: int) -> dict:
    cold, ram, disk = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        for i in range(repeats):
            system = prefix_text(tokens, 1500 + i * 3000)
            srv = Server(model, state, True, threads)
            cold.append(ttft(srv.base, system, "What is the main point?"))
            ram.append(ttft(srv.base, system, "What is the main point?"))
            srv.stop()  # drains the disk writes
            srv = Server(model, state, True, threads)
            disk.append(ttft(srv.base, system, "What is the main point?"))
            status = httpx.get(srv.base + "/v1/admin/kv/status").json()["models"]["m"]
            assert status["disk"]["hits"] == 1, status
            srv.stop()
    med = {k: statistics.median(v) for k, v in (("cold", cold), ("ram", ram), ("disk", disk))}
    return {"model": model, "prefix_tokens": tokens, "repeats": repeats, "cold_s": cold, "ram_s": ram,
            "disk_s": disk, "median": med, "speedup_ram": med["cold"] / med["ram"],
            "speedup_disk": med["cold"] / med["disk"]}


def measure_throughput(model: str, n_requests: int, threads: int, concurrency: int) -> dict:
    systems = [prefix_text(400, 30000 + i * 2500) for i in range(5)]
    out = {}
    for label, enabled in (("without_cache", False), ("with_cache", True)):
        with tempfile.TemporaryDirectory() as tmp:
            srv = Server(model, Path(tmp), enabled, threads)

            def one(i: int) -> None:
                body = {"model": "m", "max_tokens": 8, "temperature": 0,
                        "messages": [{"role": "system", "content": systems[i % 5]},
                                     {"role": "user", "content": f"Question {i}: summarise it."}]}
                r = httpx.post(srv.base + "/v1/chat/completions", json=body, timeout=600)
                r.raise_for_status()

            t0 = time.perf_counter()
            with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
                list(pool.map(one, range(n_requests)))
            elapsed = time.perf_counter() - t0
            stats = httpx.get(srv.base + "/v1/admin/scheduling/status").json()["models"]["m"]
            srv.stop()
        out[label] = {"seconds": elapsed, "requests_per_s": n_requests / elapsed,
                      "prefill_tokens": stats["prefill_tokens"]}
    out["speedup"] = out["with_cache"]["requests_per_s"] / out["without_cache"]["requests_per_s"]
    return {"model": model, "requests": n_requests, "system_prompts": 5, "concurrency": concurrency, **out}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="gemma3-270m", choices=list(MODELS))
    ap.add_argument("--throughput-model", default="smollm2-135m", choices=list(MODELS))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prefix-tokens", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "prefix_cache.json")
    args = ap.parse_args(argv)
    t = measure_ttft(args.model, args.repeats, args.threads, args.prefix_tokens)
    tp = measure_throughput(args.throughput_model, args.requests, args.threads, args.concurrency)
    m = t["median"]
    print(f"\nTTFT, {t['prefix_tokens']}-token prefix, {args.model}, median of {args.repeats}")
    print(f"{'prefix':<28}{'TTFT s':>8}{'vs cold':>9}")
    print(f"{'cold':<28}{m['cold']:>8.3f}{1.0:>9.1f}")
    print(f"{'RAM tier':<28}{m['ram']:>8.3f}{t['speedup_ram']:>9.1f}")
    print(f"{'disk tier after a restart':<28}{m['disk']:>8.3f}{t['speedup_disk']:>9.1f}")
    print(f"\n{tp['requests']} requests, 5 system prompts, {tp['concurrency']} concurrent, {args.throughput_model}")
    for label in ("without_cache", "with_cache"):
        r = tp[label]
        print(f"{label:<16}{r['seconds']:>8.1f} s{r['requests_per_s']:>8.2f} req/s  prefill {r['prefill_tokens']} tokens")
    print(f"speedup {tp['speedup']:.2f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "prefix_cache", "threads": args.threads,
                                    "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                    "ttft": t, "throughput": tp}, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
