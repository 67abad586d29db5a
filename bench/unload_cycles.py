"""Resident memory of an idle server across load/unload cycles under concurrent traffic.

Each round: 8 clients take every kind of request of bench/soak.py on both models for `--round-s`
seconds (the models load on demand), then, with no client left, both models are unloaded and the
process's resident memory is read (RSS, and from /proc/PID/smaps the [heap], the other anonymous
mappings, the file mappings). An appliance that loads models on demand must come back to the
same size each time it is idle.

The variants run one after the other in this run, the same rounds each (their request counts
say whether a variant costs throughput):
- `eie`: as shipped (malloc_trim after frees, malloc arenas capped at 2);
- `arenas_16`: `MALLOC_ARENA_MAX=16` (glibc's own cap on 2 cores), trims kept;
- `heap_off`: `EIE_HEAP=0`, neither trims nor the cap (what glibc does by itself).

Usage: .venv/bin/python bench/unload_cycles.py [--rounds 6] [--round-s 30] [--variants eie,heap_off]
       [--json bench/results/unload_cycles.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
import soak  # noqa: E402
from eie_server import EieServer  # noqa: E402

VARIANTS = {"eie": {}, "arenas_16": {"MALLOC_ARENA_MAX": "16"}, "heap_off": {"EIE_HEAP": "0"}}


def smaps_mib(pid: int) -> dict[str, float]:
    """Resident MiB by kind of mapping: the brk heap, other anonymous memory, mapped files."""
    kb = {"heap": 0, "anon": 0, "file": 0}
    kind = "anon"
    with open(f"/proc/{pid}/smaps") as f:
        for line in f:
            parts = line.split()
            if parts and not parts[0].endswith(":"):  # a mapping's first line: range perms offset dev inode [path]
                path = parts[5] if len(parts) > 5 else ""
                kind = "heap" if path == "[heap]" else "anon" if not path or path.startswith("[") else "file"
            elif parts[:1] == ["Rss:"]:
                kb[kind] += int(parts[1])
    return {k: round(v / 1024, 1) for k, v in kb.items()}


def run_variant(name: str, rounds: int, round_s: float, workdir: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES", "EIE_HEAP")}
    env.update(VARIANTS[name])
    cfg = soak.config_for(workdir, churn=True)
    cfg["policy"]["keep_alive_s"] = 300  # unloaded by this script at the end of each round
    srv = EieServer(cfg, workdir, env=env)
    proc = psutil.Process(srv.proc.pid)
    tally = soak.Tally()
    out = []
    try:
        for _ in range(rounds):
            async def traffic() -> None:
                until = time.monotonic() + round_s
                await asyncio.gather(*(soak.client_loop(srv.base, i, tally, until) for i in range(8)))

            asyncio.run(traffic())
            soak.rest(srv.base, unload=True)
            out.append({"rss_mib": round(proc.memory_info().rss / 2**20, 1), **smaps_mib(proc.pid),
                        "threads": proc.num_threads()})
    finally:
        srv.stop()
    return {"rounds": out, "requests": sum(tally.kinds.values()), "failures": tally.bad_count}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--round-s", type=float, default=30)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    results = {}
    for name in args.variants.split(","):
        with tempfile.TemporaryDirectory(prefix="eie-cycles-") as d:
            results[name] = run_variant(name, args.rounds, args.round_s, Path(d))
        r = results[name]
        r["requests_per_s"] = round(r["requests"] / (args.rounds * args.round_s), 2)
        print(f"{name}: {r['requests']} requests ({r['requests_per_s']}/s), {r['failures']} failed checks",
              flush=True)
    print(f"{'round':>5} " + " ".join(f"{n + ' RSS MiB':>18}" for n in results))
    for i in range(args.rounds):
        print(f"{i + 1:>5} " + " ".join(f"{r['rounds'][i]['rss_mib']:>18}" for r in results.values()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"round_s": args.round_s, "clients": 8, "cpu_cores": os.cpu_count(),
                                         "variants": results}, indent=2) + "\n")
    return 0 if all(r["failures"] == 0 for r in results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
