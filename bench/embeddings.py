#!/usr/bin/env python3
"""/v1/embeddings: EIE's embedding model against llama-server `--embeddings`, side by side.

The same GGUF, threads, slots and batch on both (serve_vs_llama_server's ModelSpec): EIE with
`embedding: true` (mean pooling: the bundled models are generative and name no pooling), and
llama-server with `--embeddings --pooling mean` and its usual flags for the bench
(llama_server_flags). Each repeat sends --inputs sentences (about 12-20 tokens each) in one
request, and then the same sentences one request each, 4 at a time; figures are inputs per
second over the whole requests, median of --repeats, the servers alternating. The JSON also has
the lowest cosine between the two servers' vectors for the same input (both normalise).

Run: .venv/bin/python bench/embeddings.py [--repeats 5] [--model all]
Prints a table and writes bench/results/embeddings.json.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from serve_vs_llama_server import (  # noqa: E402
    HOST, HTTP_TIMEOUT, MODELS, REPO, Server, bench_arguments, corpus_sentences, eie_config_yaml, free_port,
    llama_server_flags, log, run_per_model, save_results, wait_for_quiet,
)


def embedding_config_yaml(spec, port: int, cache_dir: Path) -> str:
    """The bench's EIE config with the model as an embedding model (mean pooling)."""
    return eie_config_yaml(spec, port, cache_dir).replace(
        "kv_cache: {mode: f16}}", "kv_cache: {mode: f16}, embedding: true, pooling: mean}")


def servers(spec, binary: Path, workdir: Path) -> tuple[Server, Server]:
    eie_port, llama_port = free_port(), free_port()
    cfg = workdir / f"eie-embed-{spec.name}.yaml"
    cfg.write_text(embedding_config_yaml(spec, eie_port, workdir / f"eie-embed-cache-{spec.name}"))
    eie = Server("eie", [str(REPO / ".venv" / "bin" / "eie"), "serve", "--config", str(cfg), "--port",
                         str(eie_port), "--log-level", "warning"], eie_port, workdir / f"eie-embed-{spec.name}.log")
    slot_dir = workdir / f"slots-embed-{spec.name}"
    slot_dir.mkdir(exist_ok=True)
    llama = Server("llama-server", [str(binary), *llama_server_flags(spec, slot_dir), "--embeddings", "--pooling",
                                    "mean", "--host", HOST, "--port", str(llama_port)],
                   llama_port, workdir / f"llama-server-embed-{spec.name}.log")
    return eie, llama


async def embed(client: httpx.AsyncClient, base: str, model: str, inputs: list[str]) -> np.ndarray:
    r = await client.post(f"{base}/v1/embeddings", json={"model": model, "input": inputs})
    if r.status_code != 200:
        raise RuntimeError(f"{base} answered {r.status_code}: {r.text[:500]}")
    data = sorted(r.json()["data"], key=lambda d: d["index"])
    v = np.array([d["embedding"] for d in data], dtype=np.float64)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


async def one_by_one(client: httpx.AsyncClient, base: str, model: str, inputs: list[str]) -> np.ndarray:
    gate = asyncio.Semaphore(4)

    async def single(text: str) -> np.ndarray:
        async with gate:
            return (await embed(client, base, model, [text]))[0]

    return np.array(await asyncio.gather(*(single(t) for t in inputs)))


async def bench_model(name: str, binary: Path, workdir: Path, args: argparse.Namespace) -> dict:
    spec = MODELS[name]
    eie, llama = servers(spec, binary, workdir)
    sentences = corpus_sentences()
    rates: dict[str, list[float]] = {}
    lowest_cosine = 1.0
    try:
        eie.start()
        llama.start()
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as client:
            for rep in range(-1, args.repeats):  # -1: warm-up
                inputs = [f"{rep + 2}. {sentences[(rep * 7 + i) % len(sentences)]}" for i in range(args.inputs)]
                got = {}
                for server in ((eie, llama) if rep % 2 == 0 else (llama, eie)):
                    for kind, call in (("batch", embed), ("single", one_by_one)):
                        await wait_for_quiet([], 0.3, 30)
                        t = time.perf_counter()
                        got[server.name, kind] = await call(client, server.base, name, inputs)
                        took = time.perf_counter() - t
                        if rep >= 0:
                            rates.setdefault(f"{server.name} {kind}", []).append(len(inputs) / took)
                            log(f"  {name} rep {rep + 1} {server.name:12s} {kind:6s} {len(inputs) / took:7.1f} inputs/s")
                cos = (got["eie", "batch"] * got["llama-server", "batch"]).sum(axis=1)
                lowest_cosine = min(lowest_cosine, float(cos.min()))
    finally:
        eie.stop()
        llama.stop()
    return {"model": name, "samples": rates, "lowest_cosine_eie_vs_llama": round(lowest_cosine, 6),
            "median_inputs_s": {k: round(statistics.median(v), 1) for k, v in rates.items()}}


def main() -> int:
    p = bench_arguments(__doc__, "embeddings.json")
    p.add_argument("--inputs", type=int, default=64)
    a = p.parse_args()
    results = run_per_model(bench_model, a, "eie-embeddings-")
    cols = ("llama-server batch", "eie batch", "llama-server single", "eie single")
    print(f"{a.inputs} sentences, one request and one each (4 at a time), median of {a.repeats}; inputs/s")
    print(f"{'model':<14} " + " ".join(f"{c:>19}" for c in cols) + "  lowest cosine")
    for r in results:
        m = r["median_inputs_s"]
        print(f"{r['model']:<14} " + " ".join(f"{m[c]:>19.1f}" for c in cols)
              + f"  {r['lowest_cosine_eie_vs_llama']:.6f}")
    save_results(a.out, a.repeats, results, inputs=a.inputs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
