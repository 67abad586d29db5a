"""Serve SmolLM2 from the GPU with a CUDA build of EIE and report what it did (bench/cuda_check.sh serve).

Starts a real `eie serve` (fixed-appliance: SmolLM2 with an f16 KV cache and SmolLM2 with q8_0),
times exec to /health 200, saves /health, /v1/admin/vram/status, a greedy chat completion and the
memory/KV lines of /metrics, times decoding with 1 and 4 streams (median of 3), and checks that a
TurboQuant KV cache is refused at load on the GPU with a clear message. Then serves SmolLM2 again
with `n_gpu_layers: auto` under a budget of about half of what it took on the GPU, and records the
layers the server placed there, its estimate against llama.cpp's GPU buffers, and an answer. Last,
one server holds SmolLM2 at several layer counts (SWEEP) and records, for each, what llama.cpp put
on the GPU against the estimate's GPU part (resources/offload.py: its allowance for a split
model's larger compute buffer rests on the one measurement of the partial offload above). With
`--frozen EXE` (a `make binary` build), that executable serves SmolLM2 too, started with `env -i`
from `/`: exec to /health, the device its model went to, and an answer.
Writes cuda.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from eie_server import EieServer, StartFailed

MODEL = "SmolLM2-135M-Instruct.Q4_1.gguf"
SWEEP = (0, 1, 4, 8, 16, 24, 30, 31)  # n_gpu_layers; SmolLM2 has 30 repeating layers and the output


def config(model_dir: Path, cache_dir: Path, kv_modes: dict[str, str]) -> dict:
    return {
        "policy": {"strategy": "fixed-appliance"},
        "model_dir": str(model_dir),
        "server": {"cache_dir": str(cache_dir), "state_dir": str(cache_dir / "state")},
        "models": [{"name": name, "path": MODEL, "n_ctx": 4096, "n_parallel": 4, "kv_cache": {"mode": mode}}
                   for name, mode in kv_modes.items()],
    }


def partial_offload(model_dir: Path, state: Path, full_gpu_bytes: int, results: Path) -> dict:
    """SmolLM2 (f16 KV) under a budget whose critical watermark holds about half of what the whole
    model took on the GPU: `auto` places fewer layers there; what did the GPU get?"""
    cfg = config(model_dir, state / "cache", {"smollm2-half": "f16"})
    budget_mb = max(1, round(full_gpu_bytes / 2 / 0.95 / (1 << 20)))
    cfg["vram"] = {"budget_mb": budget_mb}
    srv = EieServer(cfg, state)
    try:
        status = httpx.get(srv.base + "/v1/admin/vram/status", timeout=30).json()
        (results / "vram-status-partial.json").write_text(json.dumps(status, indent=2))
        model = next(m for m in status["models"] if m["name"] == "smollm2-half")
        answer = httpx.post(srv.base + "/v1/chat/completions", timeout=120, json={
            "model": "smollm2-half", "temperature": 0, "max_tokens": 24,
            "messages": [{"role": "user", "content": "Name three colours of the rainbow."}]}).json()
    finally:
        srv.stop()
    critical = status["budgets"]["device"]["critical_watermark_bytes"]
    return {"budget_mb": budget_mb, "gpu_layers": model["gpu_layers"], "device": model["device"],
            "gpu_memory_bytes": model["gpu_memory_bytes"], "host_memory_bytes": model["host_memory_bytes"],
            "critical_watermark_bytes": critical, "within_budget": model["gpu_memory_bytes"] <= critical,
            "answer": answer["choices"][0]["message"]["content"]}


def layer_sweep(model_dir: Path, state: Path, results: Path) -> list[dict]:
    """SmolLM2 (f16 KV, the partial offload's shape) at each SWEEP layer count in one server:
    llama.cpp's GPU buffers against the estimate's GPU part, after a long prompt ran on each."""
    cfg = config(model_dir, state / "cache", {})
    cfg["models"] = [{"name": f"layers-{n}", "path": MODEL, "n_ctx": 4096, "n_parallel": 4, "n_gpu_layers": n,
                      "kv_cache": {"mode": "f16"}} for n in SWEEP]
    srv = EieServer(cfg, state, start_timeout=300)
    try:
        for n in SWEEP:  # a 512-token batch: the size where llama.cpp offloads host layers' products
            httpx.post(srv.base + "/v1/completions", timeout=300, json={
                "model": f"layers-{n}", "prompt": "lighthouse " * 500, "max_tokens": 1}).raise_for_status()
        status = httpx.get(srv.base + "/v1/admin/vram/status", timeout=30).json()
    finally:
        srv.stop()
    (results / "vram-status-sweep.json").write_text(json.dumps(status, indent=2))
    rows = []
    for n in SWEEP:
        m = next(x for x in status["models"] if x["name"] == f"layers-{n}")
        rows.append({"n_gpu_layers": n, "gpu_memory_bytes": m["gpu_memory_bytes"],
                     "estimated_gpu_bytes": m["estimate"]["gpu_memory_bytes"], "compute_bytes": m["compute_bytes"],
                     "estimated_compute_bytes": m["estimate"]["compute_bytes"]})
    return rows


def frozen_serve(exe: Path, model_dir: Path, state: Path, results: Path) -> dict:
    """The frozen executable from an empty environment: what `eie doctor` chose and a model served."""
    doctor = subprocess.run(["env", "-i", str(exe), "doctor"], cwd="/", capture_output=True, text=True, timeout=120)
    (results / "frozen-doctor.txt").write_text(doctor.stdout + doctor.stderr)
    srv = EieServer(config(model_dir, state / "frozen-cache", {"smollm2-frozen": "f16"}), state,
                    cmd=["env", "-i", str(exe)], cwd="/")
    try:
        status = httpx.get(srv.base + "/v1/admin/vram/status", timeout=30).json()
        model = next(m for m in status["models"] if m["name"] == "smollm2-frozen")
        answer = httpx.post(srv.base + "/v1/chat/completions", timeout=120, json={
            "model": "smollm2-frozen", "temperature": 0, "max_tokens": 24,
            "messages": [{"role": "user", "content": "Name three colours of the rainbow."}]}).json()
    finally:
        code = srv.stop()
    return {"health_s": round(srv.started_s, 2), "device": model["device"], "gpu_layers": model["gpu_layers"],
            "gpu_memory_bytes": model["gpu_memory_bytes"], "answer": answer["choices"][0]["message"]["content"],
            "exit_code": code, "doctor_backends": [ln.strip() for ln in doctor.stdout.splitlines()
                                                   if " -> " in ln or "models load into" in ln]}


def decode_rate(base: str, model: str, streams: int) -> float:
    """Generated tokens per second of `streams` concurrent greedy 256-token completions."""
    body = {"model": model, "prompt": "Write a long story about a lighthouse keeper.\n", "max_tokens": 256,
            "temperature": 0, "speculative": False}

    def one(_: int) -> int:
        r = httpx.post(base + "/v1/completions", json=body, timeout=300)
        r.raise_for_status()
        return r.json()["usage"]["completion_tokens"]

    with ThreadPoolExecutor(streams) as pool:
        t = time.perf_counter()
        tokens = sum(pool.map(one, range(streams)))
        return tokens / (time.perf_counter() - t)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--results", type=Path, required=True)
    ap.add_argument("--frozen", type=Path, help="a frozen `eie` executable to serve from too")
    args = ap.parse_args()
    args.results.mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="eie-cuda-"))
    report: dict = {}

    srv = EieServer(config(args.model_dir, state / "cache", {"smollm2-f16": "f16", "smollm2-q8": "q8_0"}), state)
    report["health_s"] = round(srv.started_s, 2)
    try:
        for path, name in (("/health", "health"), ("/v1/admin/vram/status", "vram-status")):
            (args.results / f"{name}.json").write_text(json.dumps(httpx.get(srv.base + path, timeout=30).json(), indent=2))
        vram = json.loads((args.results / "vram-status.json").read_text())
        f16 = next(m for m in vram["models"] if m["name"] == "smollm2-f16")
        report["whole_model_on_gpu"] = {k: f16[k] for k in ("device", "gpu_layers", "gpu_memory_bytes",
                                                             "host_memory_bytes", "estimate")}
        chat = httpx.post(srv.base + "/v1/chat/completions", timeout=120, json={
            "model": "smollm2-f16", "temperature": 0, "max_tokens": 48,
            "messages": [{"role": "user", "content": "Name three colours of the rainbow."}]}).json()
        (args.results / "chat.json").write_text(json.dumps(chat, indent=2))
        report["chat_answer"] = chat["choices"][0]["message"]["content"]
        rates: dict[str, dict[str, float]] = {}
        for model in ("smollm2-f16", "smollm2-q8"):
            decode_rate(srv.base, model, 1)  # warm-up
            for streams in (1, 4):
                runs = [decode_rate(srv.base, model, streams) for _ in range(3)]
                rates[f"{model} x{streams}"] = {"median_tok_s": round(statistics.median(runs), 1),
                                                "runs": [round(r, 1) for r in runs]}
        report["decode"] = rates
        metrics = httpx.get(srv.base + "/metrics", timeout=30).text.splitlines()
        (args.results / "metrics.txt").write_text(
            "\n".join(line for line in metrics if line.startswith(("eie_memory", "eie_model", "eie_kv"))) + "\n")
    finally:
        srv.stop()

    try:
        EieServer(config(args.model_dir, state / "cache", {"smollm2-turbo3": "turbo3"}), state, start_timeout=120).stop()
        report["turbo3_on_gpu"] = "served"
    except StartFailed as e:
        log = e.log.read_text(errors="replace").splitlines()
        report["turbo3_on_gpu"] = next((line for line in reversed(log) if "turbo3" in line), log[-1] if log else str(e))

    if report["whole_model_on_gpu"]["device"] != "cpu":
        report["partial_offload"] = partial_offload(args.model_dir, state,
                                                    report["whole_model_on_gpu"]["gpu_memory_bytes"], args.results)
        report["layer_sweep"] = layer_sweep(args.model_dir, state, args.results)
    else:
        report["partial_offload"] = None  # a CPU-only build (bench/cuda_check.sh serve run without a GPU)
        report["layer_sweep"] = []

    if args.frozen is not None:
        try:
            report["frozen"] = frozen_serve(args.frozen, args.model_dir, state, args.results)
        except StartFailed as e:
            report["frozen"] = {"failed": str(e), "log_tail": e.log.read_text(errors="replace")[-2000:]}
    (args.results / "cuda.json").write_text(json.dumps(report, indent=2))
    print(f"exec to /health 200: {report['health_s']} s\nanswer: {report['chat_answer']!r}")
    print(f"{'model x streams':<20} {'median tok/s':>12}  runs")
    for k, v in report["decode"].items():
        print(f"{k:<20} {v['median_tok_s']:>12}  {v['runs']}")
    print(f"turbo3 on the GPU: {report['turbo3_on_gpu']}")
    whole, part = report["whole_model_on_gpu"], report["partial_offload"]
    print(f"whole model: {whole['gpu_layers']} on {whole['device']}, {whole['gpu_memory_bytes'] / 2**20:.0f} MiB "
          f"of GPU memory, {whole['host_memory_bytes'] / 2**20:.0f} MiB of host memory")
    if part is not None:
        print(f"budget {part['budget_mb']} MiB: {part['gpu_layers']} on {part['device']}, "
              f"{part['gpu_memory_bytes'] / 2**20:.0f} MiB of GPU memory (critical watermark "
              f"{part['critical_watermark_bytes'] / 2**20:.0f} MiB), answer {part['answer']!r}")
    if "frozen" in report:
        print(f"frozen binary: {report['frozen']}")
    if report["layer_sweep"]:
        print(f"{'n_gpu_layers':>12} {'GPU MiB':>9} {'estimate':>9} {'compute MiB':>12}")
        for row in report["layer_sweep"]:
            print(f"{row['n_gpu_layers']:>12} {row['gpu_memory_bytes'] / 2**20:>9.1f} "
                  f"{row['estimated_gpu_bytes'] / 2**20:>9.1f} {row['compute_bytes'] / 2**20:>12.1f}")


if __name__ == "__main__":
    main()
