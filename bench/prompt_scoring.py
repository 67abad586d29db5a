#!/usr/bin/env python3
"""Prompt scoring (`echo` with `logprobs`): what it costs over a plain prefill of the same prompt.

llama-server, built from the same llama.cpp source, refuses `echo` ("Only no echo is supported"),
so it cannot score a prompt; its plain prefill of the same prompt (same model, threads, slots,
context and batch: serve_vs_llama_server's make_servers) is the floor a scored prefill is held
against. Each repeat takes another passage of about --words words (a cold prompt: EIE's prefix
cache and llama-server's slots are emptied first) and times whole non-streamed requests:

  plain        /v1/completions, max_tokens 1 (the prefill and one token)
  scored       echo, logprobs 1, max_tokens 0: every prompt token's log-probability and top-1
               alternative, lm-evaluation-harness's loglikelihood request

Two EIE servers: one as make_servers configures it (no speculation: its context keeps
n_parallel = 4 logits rows, so a scored prompt is prefilled 4 tokens a decode), one with
`scoring_rows: 63` (63 tokens a decode; the default preset's speculation reserves as many rows).
Prefill rates are prompt tokens over the request's seconds. The plain request also decodes one
token. The JSON has the largest difference between the two EIE servers' summed scores of a prompt.

Run: .venv/bin/python bench/prompt_scoring.py [--repeats 5] [--model all]
Prints a table and writes bench/results/prompt_scoring.json.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from serve_vs_llama_server import (  # noqa: E402
    HTTP_TIMEOUT, MODELS, REPO, Server, bench_arguments, eie_config_yaml, empty_caches, free_port, log, long_text,
    make_servers, run_per_model, save_results, wait_for_quiet,
)


ROWS = 63


def eie_with_scoring_rows(spec, workdir: Path) -> Server:
    port = free_port()
    cfg = workdir / f"eie-rows-{spec.name}.yaml"
    text = eie_config_yaml(spec, port, workdir / f"eie-rows-cache-{spec.name}")
    cfg.write_text(text.replace("kv_cache: {mode: f16}}", f"kv_cache: {{mode: f16}}, scoring_rows: {ROWS}}}"))
    return Server(f"eie rows{ROWS}", [str(REPO / ".venv" / "bin" / "eie"), "serve", "--config", str(cfg), "--port",
                                      str(port), "--log-level", "warning"], port, workdir / f"eie-rows-{spec.name}.log",
                  flush_prefixes=True)


async def timed(client: httpx.AsyncClient, base: str, body: dict) -> tuple[float, dict]:
    t = time.perf_counter()
    r = await client.post(f"{base}/v1/completions", json=body)
    took = time.perf_counter() - t
    if r.status_code != 200:
        raise RuntimeError(f"{base} answered {r.status_code}: {r.text[:500]}")
    return took, r.json()


async def bench_model(name: str, binary: Path, workdir: Path, args: argparse.Namespace) -> dict:
    spec = MODELS[name]
    eie, llama = make_servers(spec, binary, workdir)
    eie_spec = eie_with_scoring_rows(spec, workdir)
    servers = (eie, eie_spec, llama)
    rates: dict[str, list[float]] = {}
    check: dict[str, list] = {}
    try:
        for s in servers:
            s.start()
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as client:
            for rep in range(-1, args.repeats):  # -1: warm-up
                prompt = " ".join(long_text(rep + 1)[: args.words])
                plain = {"model": name, "prompt": prompt, "max_tokens": 1, "temperature": 0, "cache_prompt": False}
                scored = {"model": name, "prompt": prompt, "max_tokens": 0, "temperature": 0, "echo": True,
                          "logprobs": 1}
                runs = [(s, "plain", plain) for s in servers] + [(s, "scored", scored) for s in (eie, eie_spec)]
                if rep % 2:
                    runs.reverse()
                for server, kind, body in runs:
                    await empty_caches(client, server)
                    await wait_for_quiet([], 0.3, 30)
                    took, answer = await timed(client, server.base, body)
                    n = answer["usage"]["prompt_tokens"]
                    key = f"{server.name} {kind}"
                    if kind == "scored":
                        lp = answer["choices"][0]["logprobs"]["token_logprobs"]
                        assert len(lp) == n and lp[0] is None
                        check.setdefault(key, []).append(sum(lp[1:]))
                    if rep >= 0:
                        rates.setdefault(key, []).append(n / took)
                        log(f"  {name} rep {rep + 1} {key:20s} {n} tokens {took:6.2f} s {n / took:7.1f} tok/s")
    finally:
        for s in servers:
            s.stop()
    out = {"model": name, "samples": rates, "prompt_tokens": n,
           "median_tok_s": {k: round(statistics.median(v), 1) for k, v in rates.items()}}
    # both EIE servers score every prompt alike (the same prefill arithmetic, other chunk sizes)
    a, b = check["eie scored"], check[f"eie rows{ROWS} scored"]
    out["max_total_logprob_difference"] = max(abs(x - y) for x, y in zip(a, b))
    return out


def main() -> int:
    p = bench_arguments(__doc__, "prompt_scoring.json")
    p.add_argument("--words", type=int, default=700)
    a = p.parse_args()
    results = run_per_model(bench_model, a, "eie-scoring-")
    cols = ("llama-server plain", "eie plain", "eie scored", f"eie rows{ROWS} plain", f"eie rows{ROWS} scored")
    print(f"prefill of a {a.words}-word passage, whole request, median of {a.repeats}; prompt tok/s")
    print(f"{'model':<14} {'tokens':>6} " + " ".join(f"{c:>18}" for c in cols))
    for r in results:
        m = r["median_tok_s"]
        print(f"{r['model']:<14} {r['prompt_tokens']:>6} " + " ".join(f"{m[c]:>18.1f}" for c in cols))
    save_results(a.out, a.repeats, results, words=a.words)
    return 0


if __name__ == "__main__":
    sys.exit(main())
