"""Idle CPU of the appliance: what a server that answers nothing burns, side by side with
llama-server (built from the same llama.cpp source; one process per model, as serving two models
with it takes) and, with --before REV, EIE at an earlier git revision.

An appliance sits idle most of its life, on a Pi or a fanless box: every wake-up costs power and
heat. Each server starts with the default preset's two models (SmolLM2 and Gemma 3 270M, loaded
at boot), answers one request per model (so every lazy first-use path has run), settles for
--settle seconds, and its process's CPU seconds are read over --seconds, --repeats times (median),
with the servers measured one after another, all of them up. The `generic` row is EIE with the
on-demand strategy (keep-alive 300 s), whose model janitor does the most.

Usage: .venv/bin/python bench/idle_cpu.py [--seconds 30] [--repeats 3] [--before f5d1094]
Writes bench/results/idle_cpu.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from serve_vs_llama_server import (HOST, MODEL_DIR, MODELS, REPO, Server, build_llama_server, free_port,
                                   llama_server_flags, log, proc_cpu_seconds)


def eie_server(name: str, strategy: str, workdir: Path, source: Path | None) -> Server:
    """EIE on the default preset's models (from `source`, a checkout of another revision, where given)."""
    preset = yaml.safe_load((REPO / "presets" / "fixed-appliance.yaml").read_text())
    port = free_port()
    preset["server"] = {"host": HOST, "port": port, "cache_dir": str(workdir / f"cache-{name}"),
                        "state_dir": str(workdir / f"state-{name}")}
    preset["policy"] = {"strategy": strategy}
    preset["model_dir"] = str(MODEL_DIR)
    cfg = workdir / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump(preset))
    env = {"PYTHONPATH": str(source)} if source is not None else {}
    # -P: the working directory (this checkout) is not put first on sys.path, so PYTHONPATH picks the code
    return Server(name, [sys.executable, "-P", "-m", "appliance", "serve", "--config", str(cfg), "--log-level", "warning"],
                  port, workdir / f"{name}.log", env=env)


def llama_servers(binary: Path, workdir: Path) -> list[Server]:
    out = []
    for spec in MODELS.values():
        port = free_port()
        slots = workdir / f"slots-{spec.name}"
        slots.mkdir(exist_ok=True)
        out.append(Server(f"llama-server {spec.name}", [str(binary), *llama_server_flags(spec, slots), "--host", HOST,
                                                        "--port", str(port)], port, workdir / f"llama-{spec.name}.log"))
    return out


def first_answers(server: Server, models: list[str]) -> None:
    for model in models:
        r = httpx.post(server.base + "/v1/chat/completions", timeout=300, json={
            "model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        r.raise_for_status()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--settle", type=float, default=10.0)
    ap.add_argument("--before", help="also measure EIE at this git revision (a worktree of it)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "idle_cpu.json")
    args = ap.parse_args()
    binary = build_llama_server(2)
    with tempfile.TemporaryDirectory(prefix="eie-idle-") as tmp:
        work = Path(tmp)
        rows: list[tuple[str, list[Server]]] = [("eie fixed-appliance", [eie_server("eie", "fixed-appliance", work, None)]),
                                                ("eie generic", [eie_server("eie-generic", "generic", work, None)])]
        if args.before:
            source = work / "before"
            subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(source), args.before],
                           check=True, capture_output=True)
            rows.append((f"eie {args.before} fixed-appliance",
                         [eie_server("eie-before", "fixed-appliance", work, source)]))
            rows.append((f"eie {args.before} generic", [eie_server("eie-before-generic", "generic", work, source)]))
        rows.append(("llama-server x2", llama_servers(binary, work)))
        try:
            for _, servers in rows:
                for s in servers:
                    s.start()
                    first_answers(s, [m.name for m in MODELS.values()] if s.name.startswith("eie") else ["x"])
            log(f"all up; settling {args.settle:.0f} s")
            time.sleep(args.settle)
            samples: dict[str, list[float]] = {label: [] for label, _ in rows}
            for i in range(args.repeats):
                for label, servers in rows:
                    before = sum(proc_cpu_seconds(s.pid) for s in servers)
                    time.sleep(args.seconds)
                    used = sum(proc_cpu_seconds(s.pid) for s in servers) - before
                    samples[label].append(used / args.seconds * 100)
                    log(f"round {i + 1}: {label}: {samples[label][-1]:.2f} % of a core")
        finally:
            for _, servers in rows:
                for s in servers:
                    s.stop()
            if args.before:
                subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(work / "before")],
                               capture_output=True)
    print(f"\nidle CPU, % of one core (median of {args.repeats} windows of {args.seconds:g} s)")
    print(f"{'server':<36} {'median':>7} {'min':>7} {'max':>7}")
    results = []
    for label, values in samples.items():
        results.append({"server": label, "median_pct": round(statistics.median(values), 3),
                        "samples_pct": [round(v, 3) for v in values]})
        print(f"{label:<36} {statistics.median(values):7.2f} {min(values):7.2f} {max(values):7.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "seconds": args.seconds,
                                    "repeats": args.repeats, "settle_s": args.settle, "results": results}, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
