#!/usr/bin/env python3
"""Structured output: decode speed under a JSON grammar, EIE against llama-server, side by side.

Both servers get the same model, threads, slots, context and batch (serve_vs_llama_server's
make_servers) and the same GBNF grammar (from EIE's JSON Schema converter, sent as the `grammar`
field, which both take) for a list of people: 6 objects of name, age (0-120) and city. A greedy
streamed /v1/completions answer of up to --max-tokens tokens is timed from its first to its last
chunk, with the grammar and without it (the same prompt), alternating which server goes first.

  decode_tok_s            without a grammar
  grammar_tok_s           with it
  cost                    1 - grammar / plain: what the grammar takes from greedy decoding
  sampled_grammar_tok_s   with it, sampled (temperature 1, no truncation, seed 1234 + the repeat,
                          the same on both; the servers draw different answers, so this
                          compares rates over five answers each, not texts)

The grammar costs a sampler one check of the token it would pick anyway; when the grammar
refuses it, llama.cpp's common sampler (llama-server) masks the whole vocabulary (6-12 ms for
SmolLM2's 49k tokens and 40-65 ms for Gemma 3's 262k on this machine), EIE (engine/grammar.py)
first looks among the 64 best logits (greedy) or redraws (sampled). The JSON counts EIE's
whole-vocabulary masks.

Run: .venv/bin/python bench/structured_output.py [--repeats 5] [--model all]
Prints a table and writes bench/results/structured_output.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from serve_vs_llama_server import (  # noqa: E402
    HTTP_TIMEOUT, MODELS, StreamResult, _absorb, bench_arguments, empty_caches, log, make_servers, run_per_model,
    save_results, wait_for_quiet,
)

from appliance.engine.schema_grammar import schema_to_gbnf  # noqa: E402

PEOPLE = {
    "type": "array", "minItems": 6, "maxItems": 6,
    "items": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 24}},
        "required": ["name", "age", "city"], "additionalProperties": False},
}
PROMPT = "Here is a JSON list of six people from a village register, with their name, age and city:\n"


# Plain sampling on both servers (llama-server's defaults add top-k 40, top-p 0.95 and min-p 0.05).
SAMPLED = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0}  # the seed is 1234 + the repeat
FIGURES = (("decode_tok_s", False, False), ("grammar_tok_s", True, False), ("sampled_grammar_tok_s", True, True))


async def stream(client: httpx.AsyncClient, base: str, model: str, max_tokens: int, grammar: str | None,
                 sampled: bool = False, seed: int = 1234) -> StreamResult:
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0.0, "stream": True,
            "stream_options": {"include_usage": True}, "cache_prompt": False,
            **({**SAMPLED, "seed": seed} if sampled else {})}
    if grammar is not None:
        body["grammar"] = grammar
    res = StreamResult(t_start=time.perf_counter())
    text = []
    async with client.stream("POST", f"{base}/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{base} answered {r.status_code}: {(await r.aread())[:500]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line[6:].strip() == "[DONE]":
                continue
            obj = json.loads(line[6:])
            text += [c.get("text") or "" for c in obj.get("choices") or []]
            _absorb(res, obj, time.perf_counter())
    res.t_end = time.perf_counter()
    res.server_timings = {"text": "".join(text)}
    return res


async def bench_model(name: str, binary: Path, workdir: Path, args: argparse.Namespace) -> dict:
    spec = MODELS[name]
    eie, llama = make_servers(spec, binary, workdir)
    grammar = schema_to_gbnf(PEOPLE)
    rows: dict[str, dict[str, list[float]]] = {}
    texts: dict[str, str] = {}
    finished: dict[str, str | None] = {}
    try:
        eie.start()
        llama.start()
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as client:
            for server in (eie, llama):  # warm-up
                await stream(client, server.base, name, 16, None)
                await stream(client, server.base, name, 16, grammar)
            for rep in range(args.repeats):
                order = (eie, llama) if rep % 2 == 0 else (llama, eie)
                for figure, constrained, sampled in FIGURES:
                    g = grammar if constrained else None
                    for server in order:
                        await empty_caches(client, server)
                        await wait_for_quiet([], 0.3, 30)
                        res = await stream(client, server.base, name, args.max_tokens, g, sampled, 1234 + rep)
                        rows.setdefault(figure, {}).setdefault(server.name, []).append(res.decode_rate)
                        texts[f"{figure}/{server.name}"] = res.server_timings["text"]
                        if g is not None and not sampled:
                            finished[server.name] = res.finish_reason
                        log(f"  {name} rep {rep + 1} {figure:14s} {server.name:12s} {res.decode_rate:7.1f} tok/s "
                            f"({res.completion_tokens} tokens, {res.finish_reason})")
            status = (await client.get(f"{eie.base}/v1/admin/scheduling/status")).json()["models"][name]
    finally:
        eie.stop()
        llama.stop()
    masks = status["grammar_masks"]
    out = {"model": name, "samples": rows, "texts": texts, "eie_grammar_sequences": status["grammar_sequences"],
           "eie_whole_vocabulary_masks": masks}
    for server in ("eie", "llama-server"):
        plain = statistics.median(rows["decode_tok_s"][server])
        constrained = statistics.median(rows["grammar_tok_s"][server])
        sampled = statistics.median(rows["sampled_grammar_tok_s"][server])
        out[server] = {"decode_tok_s": round(plain, 1), "grammar_tok_s": round(constrained, 1),
                       "cost": round(1 - constrained / plain, 3), "sampled_grammar_tok_s": round(sampled, 1)}
    out["grammar_ratio_eie_over_llama"] = round(out["eie"]["grammar_tok_s"] / out["llama-server"]["grammar_tok_s"], 3)
    for server in ("eie", "llama-server"):  # the constrained answers are the JSON asked for, when complete
        out[server]["grammar_answer_complete"] = finished[server] == "stop"
        if finished[server] == "stop":
            assert len(json.loads(texts[f"grammar_tok_s/{server}"])) == 6
    return out


def main() -> int:
    p = bench_arguments(__doc__, "structured_output.json")
    p.add_argument("--max-tokens", type=int, default=300)
    a = p.parse_args()
    results = run_per_model(bench_model, a, "eie-structured-")
    print(f"greedy /v1/completions, up to {a.max_tokens} tokens, median of {a.repeats}; tok/s")
    print(f"{'model':<14} {'server':<13} {'no grammar':>11} {'grammar':>9} {'cost':>7} {'sampled, grammar':>17}")
    for r in results:
        for server in ("eie", "llama-server"):
            f = r[server]
            print(f"{r['model']:<14} {server:<13} {f['decode_tok_s']:>11.1f} {f['grammar_tok_s']:>9.1f} {f['cost']:>7.1%} "
                  f"{f['sampled_grammar_tok_s']:>17.1f}")
    save_results(a.out, a.repeats, results, max_tokens=a.max_tokens, schema=PEOPLE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
