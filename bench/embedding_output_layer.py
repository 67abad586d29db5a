#!/usr/bin/env python3
"""Patch 0017 (a pooling context without the output layer): EIE's embedding model on this build
against the same EIE on a build without the patch, side by side.

The "before" server loads llama.cpp from --before-lib (LLAMA_CPP_LIB_PATH: the `llama_cpp/lib`
directory of a wheel built without patch 0017, e.g. unzipped from the previous cached wheel), the
"after" server from the installed wheel; everything else is the same (bench/embeddings.py's
config: mean pooling, 4 slots, the bench's n_batch and threads). Each repeat sends --inputs
sentences in one request to each server, the order alternating; figures are inputs per second,
median of --repeats. The JSON also has each server's compute and output buffers
(/v1/admin/vram/status `compute_bytes`) and the lowest cosine between the two servers' vectors.

Run: .venv/bin/python bench/embedding_output_layer.py --before-lib DIR [--repeats 5] [--model all]
Prints a table and writes bench/results/embedding_output_layer.json.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from embeddings import embed, embedding_config_yaml  # noqa: E402
from serve_vs_llama_server import (  # noqa: E402
    HTTP_TIMEOUT, MODELS, REPO, Server, bench_arguments, corpus_sentences, free_port, log,
    save_results, wait_for_quiet,
)


def eie_server(spec, workdir: Path, label: str, lib: Path | None) -> Server:
    port = free_port()
    cfg = workdir / f"eie-{label}-{spec.name}.yaml"
    cfg.write_text(embedding_config_yaml(spec, port, workdir / f"cache-{label}-{spec.name}"))
    return Server(label, [str(REPO / ".venv" / "bin" / "eie"), "serve", "--config", str(cfg), "--port", str(port),
                          "--log-level", "warning"], port, workdir / f"eie-{label}-{spec.name}.log",
                  env={"LLAMA_CPP_LIB_PATH": str(lib)} if lib else {})


async def bench_model(name: str, workdir: Path, args) -> dict:
    spec = MODELS[name]
    before, after = eie_server(spec, workdir, "before", args.before_lib), eie_server(spec, workdir, "after", None)
    sentences = corpus_sentences()
    rates: dict[str, list[float]] = {}
    compute: dict[str, int] = {}
    lowest_cosine = 1.0
    try:
        before.start()
        after.start()
        async with httpx.AsyncClient(timeout=HTTP_TIMEOUT) as client:
            for server in (before, after):
                status = (await client.get(server.base + "/v1/admin/vram/status")).json()
                compute[server.name] = next(m["compute_bytes"] for m in status["models"] if m["name"] == name)
            for rep in range(-1, args.repeats):  # -1: warm-up
                inputs = [f"{rep + 2}. {sentences[(rep * 7 + i) % len(sentences)]}" for i in range(args.inputs)]
                got = {}
                for server in ((before, after) if rep % 2 == 0 else (after, before)):
                    await wait_for_quiet([], 0.3, 30)
                    t = time.perf_counter()
                    got[server.name] = await embed(client, server.base, name, inputs)
                    took = time.perf_counter() - t
                    if rep >= 0:
                        rates.setdefault(server.name, []).append(len(inputs) / took)
                        log(f"  {name} rep {rep + 1} {server.name:6s} {len(inputs) / took:7.1f} inputs/s")
                lowest_cosine = min(lowest_cosine, float((got["before"] * got["after"]).sum(axis=1).min()))
    finally:
        before.stop()
        after.stop()
    return {"model": name, "samples": rates, "compute_bytes": compute, "lowest_cosine": round(lowest_cosine, 7),
            "median_inputs_s": {k: round(statistics.median(v), 1) for k, v in rates.items()}}


def main() -> int:
    p = bench_arguments(__doc__, "embedding_output_layer.json")
    p.add_argument("--inputs", type=int, default=64)
    p.add_argument("--before-lib", type=Path, required=True,
                   help="llama_cpp/lib of a build without patch 0017 (LLAMA_CPP_LIB_PATH)")
    a = p.parse_args()
    names = list(MODELS) if a.model == "all" else [a.model]
    with tempfile.TemporaryDirectory(prefix="eie-embed-0017-") as tmp:
        results = [asyncio.run(bench_model(n, Path(tmp), a)) for n in names]
    print(f"{a.inputs} sentences in one request, median of {a.repeats}")
    print(f"{'model':<14} {'before inputs/s':>16} {'after inputs/s':>15} {'before MiB':>11} {'after MiB':>10}"
          "  lowest cosine")
    for r in results:
        m, c = r["median_inputs_s"], r["compute_bytes"]
        print(f"{r['model']:<14} {m['before']:>16.1f} {m['after']:>15.1f} {c['before'] / 2**20:>11.1f}"
              f" {c['after'] / 2**20:>10.1f}  {r['lowest_cosine']:.7f}")
    save_results(a.out, a.repeats, results, inputs=a.inputs, before_lib=str(a.before_lib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
