"""The memory a live KV type change takes: staged (as shipped) against direct, side by side.

A server holds one model with 4 sequences of 8,192 cells and 4 live streams, each of which read
about 1,000 tokens of the GNU GPL v3 and goes on generating. The model's KV is then changed three
times through `POST /v1/admin/kv/convert` (f16 → q8_0 → turbo3 → f16, as the adaptive ladder
steps down and back up). Around each change the server's peak RSS is reset (`/proc/PID/clear_refs`)
and read back (VmHWM): the growth over the RSS before the change is what the change took.

- `staged` (as shipped): the live states are converted into host memory, the old context freed,
  the new one created and the states written in: a peak of the larger context plus the states;
- `direct` (`EIE_KV_MIGRATE=direct`): the new context is created first and each state copied
  across, then the old one freed: both contexts at once.

The two ways alternate within each repeat; memory is the median over repeats, and so are the
change's seconds (the runner's own timing, in the change's record).

Usage: .venv/bin/python bench/kv_migration_peak.py [--models smollm2,gemma3] [--repeats 3]
       [--json bench/results/kv_migration_peak.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from eie_server import EieServer  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"smollm2": "SmolLM2-135M-Instruct.Q4_1.gguf", "gemma3": "gemma-3-270m-q4_k_m.gguf"}
END_TOKENS = {"smollm2": ("0", "2"), "gemma3": ("1", "106")}  # banned: the streams stay live
CHANGES = [("f16", "q8_0"), ("q8_0", "turbo3"), ("turbo3", "f16")]
WAYS = {"staged": {}, "direct": {"EIE_KV_MIGRATE": "direct"}}
STREAMS, N_CTX = 4, 8192
MIB = 2**20


def proc_bytes(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def stream(base: str, body: dict, started: threading.Event, stop: threading.Event) -> None:
    with httpx.stream("POST", base + "/v1/completions", json=body, timeout=600) as r:
        for n, _ in enumerate(r.iter_lines()):
            if n >= 4:
                started.set()
            if stop.is_set():
                return


def kv_bytes(base: str) -> int:
    models = httpx.get(base + "/v1/admin/vram/status", timeout=10).json()["models"]
    return next(m["kv_cache_bytes"] for m in models if m["name"] == "m")


def run(model: str, way: str, workdir: Path, prompt: str) -> list[dict]:
    cfg = {"policy": {"strategy": "fixed-appliance"},
           "server": {"state_dir": str(workdir / "state"), "cache_dir": str(workdir / "cache")},
           "models": [{"name": "m", "path": str(ROOT / "models" / MODELS[model]), "n_ctx": N_CTX,
                       "n_parallel": STREAMS, "threads": os.cpu_count() or 2,
                       "kv_cache": {"mode": CHANGES[0][0], "prefix": {"enabled": False}}}]}
    env = {k: v for k, v in os.environ.items() if k != "EIE_KV_MIGRATE"}
    srv = EieServer(cfg, workdir, env={**env, **WAYS[way]})
    stop = threading.Event()
    starts = [threading.Event() for _ in range(STREAMS)]
    bodies = [{"model": "m", "prompt": f"{prompt} [{i}]", "max_tokens": 4000, "temperature": 0, "stream": True,
               "logit_bias": {t: -100 for t in END_TOKENS[model]}} for i in range(STREAMS)]
    threads = [threading.Thread(target=stream, args=(srv.base, body, s, stop), daemon=True)
               for body, s in zip(bodies, starts)]
    out = []
    try:
        for t in threads:
            t.start()
        for s in starts:
            if not s.wait(300):
                raise RuntimeError("a stream did not start")
        pid = srv.proc.pid
        for source, target in CHANGES:
            old_kv = kv_bytes(srv.base)
            rss = proc_bytes(pid, "VmRSS")
            Path(f"/proc/{pid}/clear_refs").write_text("5")
            r = httpx.post(srv.base + "/v1/admin/kv/convert", json={"model": "m", "mode": target}, timeout=300)
            r.raise_for_status()
            rec = r.json()
            assert rec["from"] == [source, source] and rec["sequences"] == STREAMS, rec
            out.append({"model": model, "way": way, "change": f"{source}->{target}",
                        "peak_growth_mib": (proc_bytes(pid, "VmHWM") - rss) / MIB,
                        "rss_change_mib": (proc_bytes(pid, "VmRSS") - rss) / MIB,
                        "kv_before_mib": old_kv / MIB, "kv_after_mib": kv_bytes(srv.base) / MIB,
                        "states_before_mib": rec["state_bytes_before"] / MIB,
                        "states_after_mib": rec["state_bytes_after"] / MIB, "seconds": rec["seconds"]})
    finally:
        stop.set()
        srv.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=ROOT / "bench" / "results" / "kv_migration_peak.json")
    args = ap.parse_args()
    prompt = Path("/usr/share/common-licenses/GPL-3").read_text()[:4500]  # about 1,000 tokens
    rows: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.repeats):
            for model in args.models.split(","):
                ways = list(WAYS) if rep % 2 == 0 else list(reversed(WAYS))
                for way in ways:
                    workdir = Path(tmp) / f"{model}-{way}-{rep}"
                    workdir.mkdir()
                    rows += [{**r, "repeat": rep} for r in run(model, way, workdir, prompt)]
    summary = []
    keys = ("peak_growth_mib", "rss_change_mib", "kv_before_mib", "kv_after_mib", "states_after_mib", "seconds")
    for model in args.models.split(","):
        for source, target in CHANGES:
            change = f"{source}->{target}"
            line = {"model": model, "change": change}
            for way in WAYS:
                got = [r for r in rows if r["model"] == model and r["way"] == way and r["change"] == change]
                line[way] = {k: round(statistics.median(r[k] for r in got), 4 if k == "seconds" else 1) for k in keys}
            summary.append(line)
    print(f"{'model':8} {'change':14} {'KV before':>9} {'KV after':>8} {'states':>7} "
          f"{'peak staged':>11} {'peak direct':>11} {'s staged':>8} {'s direct':>8}  (MiB; peak = VmHWM - RSS before)")
    for line in summary:
        s, d = line["staged"], line["direct"]
        print(f"{line['model']:8} {line['change']:14} {s['kv_before_mib']:9.1f} {s['kv_after_mib']:8.1f} "
              f"{s['states_after_mib']:7.1f} {s['peak_growth_mib']:11.1f} {d['peak_growth_mib']:11.1f} "
              f"{s['seconds']:8.3f} {d['seconds']:8.3f}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
                                     "streams": STREAMS, "n_ctx": N_CTX, "summary": summary, "runs": rows},
                                    indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
