"""Compute buffers, EIE against llama-server, side by side in one run: the memory llama.cpp reserves
for one decode, most of it the logits of the rows a decode may ask for (resources/outputs.py).

For each bundled model, with the default preset's shape (4 sequences of 4096 tokens, n_batch 512,
2 threads, flash attention auto), without and with speculative decoding (16 drafts a sequence):

  eie              a real `eie serve`: /v1/admin/vram/status's compute_bytes (the compute and
                   output buffers as llama.cpp reported allocating them)
  llama-server     built from the same llama.cpp source (bench/serve_vs_llama_server.py caches
                   it), the same model, slots, context, batch and threads; with speculation
                   `--spec-type ngram-simple --spec-ngram-simple-size-m 16`; the compute and output
                   buffer lines of its log
  n_batch rows     llama.cpp's default n_outputs_max (a whole ubatch of logits), which EIE reserved
                   before: the model loaded the runner's way in a child process, with n_outputs_max 0

On a CPU the rows never asked for are never touched, so the difference is in what a budget is
charged, not in the resident memory; on a GPU the buffer is device memory allocated whole.

Usage: .venv/bin/python bench/compute_buffers.py [--no-llama-server] [--out PATH]
Prints a table and writes bench/results/compute_buffers.json (or --out). Without a cached
llama-server the first run builds it (minutes on 2 cores); --no-llama-server skips that column.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from eie_server import EieServer, free_port  # noqa: E402

MODELS = {"smollm2-135m": ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
          "gemma3-270m": ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"}
N_CTX, N_PARALLEL, N_BATCH, THREADS, DRAFTS = 4096, 4, 512, 2, 16
MIB = 1024 * 1024


def eie_compute(spec: bool, state: Path) -> dict[str, int]:
    """compute_bytes of each model in a real `eie serve` with the default preset's shape."""
    models = [{"name": name, "path": str(path), "n_ctx": N_CTX, "n_parallel": N_PARALLEL, "n_batch": N_BATCH,
               "threads": THREADS} for name, path in MODELS.items()]
    config = {"policy": {"strategy": "fixed-appliance"}, "server": {"cache_dir": str(state / "cache")},
              "inference": {"speculative": {"sources": ["ngram"], "max_draft": DRAFTS} if spec else {"sources": []}},
              "models": models}
    server = EieServer(config, state)
    try:
        status = httpx.get(server.base + "/v1/admin/vram/status", timeout=30).json()
    finally:
        server.stop()
    return {m["name"]: m["compute_bytes"] for m in status["models"]}


def llama_server_compute(binary: Path, model: Path, spec: bool, state: Path) -> int:
    """The compute and output buffers llama-server's log reports for the model."""
    from appliance.engine import native
    from serve_vs_llama_server import Server

    port = free_port()
    log_path = state / f"llama-server-{model.stem}-{spec}.log"
    args = [str(binary), "-m", str(model), "-c", str(N_CTX * N_PARALLEL), "-np", str(N_PARALLEL),
            "-b", str(N_BATCH), "-ub", str(N_BATCH), "-t", str(THREADS), "-fa", "auto", "--no-kv-unified",
            "--fit", "off", "-v", "--host", "127.0.0.1", "--port", str(port)]
    if spec:
        args += ["--spec-type", "ngram-simple", "--spec-ngram-simple-size-m", str(DRAFTS)]
    server = Server("llama-server", args, port, log_path)
    try:
        server.start()
    finally:
        server.stop()
    # "0.00.091.771 I llama_context:        CPU  output buffer size = ..." (-v prefixes time and level)
    lines = [re.sub(r"^\S+ [A-Z] ", "", line) for line in log_path.read_text(errors="replace").splitlines()]
    sizes = native.parse_buffer_sizes(lines)
    if not sizes.compute:
        raise RuntimeError(f"no compute buffer line in llama-server's log ({log_path})")
    return sizes.compute + sizes.output


def whole_batch_compute(model: Path) -> int:
    """compute + output bytes with n_outputs_max 0 (n_batch rows), loaded in a child process."""
    out = subprocess.run([sys.executable, __file__, "--child", str(model)], capture_output=True, text=True,
                         check=True, timeout=600)
    return int(out.stdout.strip().splitlines()[-1])


def child(model: Path) -> None:
    from appliance.engine import native

    m = native.load(model, n_ctx_total=N_CTX * N_PARALLEL, n_seq_max=N_PARALLEL, n_batch=N_BATCH, n_threads=THREADS,
                    type_k="f16", type_v="f16", flash_attn="auto", n_outputs_max=0)
    print(m.buffers.compute + m.buffers.output)
    m.free()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--no-llama-server", action="store_true", help="skip the llama-server column")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "compute_buffers.json")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        child(a.child)
        return 0
    binary = None
    if not a.no_llama_server:
        from serve_vs_llama_server import build_llama_server

        binary = build_llama_server(THREADS)
    rows = []
    with tempfile.TemporaryDirectory(prefix="eie-compute-") as tmp:
        state = Path(tmp)
        whole = {name: whole_batch_compute(path) for name, path in MODELS.items()}
        for spec in (False, True):
            eie = eie_compute(spec, state)
            for name, path in MODELS.items():
                peer = llama_server_compute(binary, path, spec, state) if binary else None
                rows.append({"model": name, "speculative": spec, "eie_bytes": eie[name], "llama_server_bytes": peer,
                             "n_batch_rows_bytes": whole[name]})
    print(f"compute + output buffers, {N_PARALLEL} sequences × {N_CTX} tokens, n_batch {N_BATCH}, MiB")
    print(f"{'model':<14} {'speculation':<12} {'eie':>8} {'llama-server':>13} {'n_batch rows':>13}")
    for r in rows:
        peer = f"{r['llama_server_bytes'] / MIB:.1f}" if r["llama_server_bytes"] is not None else "-"
        print(f"{r['model']:<14} {'16 drafts' if r['speculative'] else 'off':<12} {r['eie_bytes'] / MIB:>8.1f} "
              f"{peer:>13} {r['n_batch_rows_bytes'] / MIB:>13.1f}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "n_ctx": N_CTX, "n_parallel": N_PARALLEL,
                                 "n_batch": N_BATCH, "threads": THREADS, "drafts": DRAFTS, "rows": rows}, indent=1))
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
