"""`eie doctor`: what this build and this machine give the engine.

Backends found (every module file with its score), the one chosen per backend and the devices it
registered, device memory with its source, the CPU features the chosen CPU module reports, and
the KV cache types this build can use.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from . import __version__

GIB = 1024**3


def collect() -> dict[str, Any]:
    """Everything `eie doctor` shows, as plain data (`--json` prints it as is)."""
    from .engine import backends, native
    from .resources import memory

    native.init_backend()  # loads the backend modules exactly as serving does
    reg = backends.registry
    gpu = native.gpu_backend()
    turbo = native.build_has_turboquant()
    kv_types = [t for t in native.GGML_TYPES if turbo or t not in native.TURBO_TYPES]
    chosen = {b.registered: b for b in reg.backends if b.registered}
    devices = []
    for d in reg.devices():
        b = chosen.get(d.backend)
        devices.append({**dataclasses.asdict(d), "module": Path(b.chosen).name if b and b.chosen else None,
                        "score": b.score if b else None})
    return {
        "version": __version__,
        "frozen": bool(getattr(sys, "frozen", False)),
        "executable": sys.executable,
        "libggml": str(reg.libggml),
        "module_dirs": [str(d) for d in reg.dirs],
        "backends": [dataclasses.asdict(b) for b in reg.backends],
        "devices": devices,
        "memory": [dataclasses.asdict(m) for m in memory.devices()],
        "compute_device": memory.compute_device().device,
        "features": reg.features(),
        "offload": gpu,
        "kv_types": kv_types,
        "turboquant": turbo,
        "turboquant_note": None if gpu is None or not turbo else
        f"turbo4/3/2 have CPU kernels only: with {gpu} offloading they fail the load (auto stops at q4_0)",
        "cpus": os.cpu_count(),
    }


def _mib(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 2**20:.0f} MiB"


def render(r: dict[str, Any]) -> str:
    lines = [f"eie {r['version']} ({'frozen' if r['frozen'] else 'python'}: {r['executable']})",
             f"libggml: {r['libggml']}", "module dirs: " + (", ".join(r["module_dirs"]) or "(none)"), "",
             "backends:"]
    for b in r["backends"]:
        lines.append(f"  {b['name']}: " + (f"{Path(b['chosen']).name} (score {b['score']}) -> {b['registered']}"
                                          if b["chosen"] else f"none usable: {b['error']}"))
        for c in b["candidates"]:
            mark = "*" if c["path"] == b["chosen"] else " "
            what = c["error"] or (f"score {c['score']}" if c["score"] is not None else "no score function")
            lines.append(f"    {mark} {Path(c['path']).name}: {what}")
    if not r["backends"]:
        lines.append("  (none loaded by eie: another component registered them first)")
    lines += ["", "devices (ggml):"]
    for d in r["devices"]:
        lines.append(f"  {d['name']} [{d['type']}] {d['description']}: backend {d['backend']}"
                     f" via {d['module']} (score {d['score']}), {_mib(d['free_bytes'])} free of {_mib(d['total_bytes'])}")
    lines += ["", "memory:"]
    for m in r["memory"]:
        lines.append(f"  {m['device']} ({m['kind']}): {_mib(m['total_bytes'])} total, {_mib(m['used_bytes'])} used,"
                     f" {_mib(m['free_bytes'])} free  [source {m['source']}]")
    lines.append(f"  models load into: {r['compute_device']}"
                 + (f" (offload to {r['offload']}, all layers)" if r["offload"] else " (CPU, no offload)"))
    lines += ["", "features:"]
    for name, feats in r["features"].items():
        lines.append(f"  {name}: " + " ".join(k if v == "1" else f"{k}={v}" for k, v in feats.items()))
    lines += ["", "KV cache types: " + " ".join(r["kv_types"])
              + ("" if r["turboquant"] else "  (no TurboQuant in this build)")]
    if r["turboquant_note"]:
        lines.append(f"  note: {r['turboquant_note']}")
    return "\n".join(lines)
