"""How much memory a loaded model keeps resident, with patch 0011 (the mapped file pages of tensors
that other buffers copied are dropped after the load) and without it (EIE_KEEP_COPIED_PAGES=1:
llama.cpp's own behaviour), side by side in one run, for both bundled models.

Each (model, setting) loads in a child process as the server loads it (appliance.engine.native),
decodes 64 tokens, and reads /proc/self/smaps: the resident bytes of the model file's mapping,
the process's anonymous memory (the AMX or CPU_REPACK copies, KV, compute buffers) and its whole
RSS. What differs with the host: on a host whose CPU backend repacks no weight of a model (SmolLM2's
Q4_1 on x86 without AMX), nothing is copied and both settings are equal.

Usage: .venv/bin/python bench/resident_weights.py [--out PATH]
Prints a table and writes bench/results/resident_weights.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODELS = {"smollm2-135m": ROOT / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf",
          "gemma3-270m": ROOT / "models" / "gemma-3-270m-q4_k_m.gguf"}
SETTINGS = {"patch 0011 (drops pages not read)": {}, "llama.cpp (keeps them)": {"EIE_KEEP_COPIED_PAGES": "1"}}
MIB = 1024 * 1024


def smaps(path: Path) -> dict[str, int]:
    """Resident bytes of this process: the mappings of `path`, anonymous memory, all."""
    out = {"model_file": 0, "anon": 0, "rss": 0}
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = len(fields) >= 6 and fields[5] == str(path)
        elif fields[0] == "Rss:":
            out["rss"] += int(fields[1]) * 1024
            if inside:
                out["model_file"] += int(fields[1]) * 1024
        elif fields[0] == "Anonymous:":
            out["anon"] += int(fields[1]) * 1024
    return out


def child(model: Path) -> dict:
    sys.path.insert(0, str(ROOT))
    import llama_cpp as lc

    from appliance.engine import native

    m = native.load(model, n_ctx_total=1024, n_seq_max=1, n_batch=64, n_threads=2, type_k="f16", type_v="f16",
                    flash_attn="on")
    after_load = smaps(model)
    batch = lc.llama_batch_init(64, 0, 1)
    for i in range(64):
        batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = 100 + i, i, 1, int(i == 63)
        batch.seq_id[i][0] = 0
    batch.n_tokens = 64
    assert lc.llama_decode(m.ctx, batch) == 0
    lc.llama_batch_free(batch)
    return {"after_load": after_load, "after_decode": smaps(model), "weights_measured": m.buffers.weights}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "resident_weights.json")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child)))
        return 0
    rows = []
    for name, path in MODELS.items():
        for setting, env in SETTINGS.items():
            out = subprocess.run([sys.executable, __file__, "--child", str(path)], env={**os.environ, **env},
                                 capture_output=True, text=True, timeout=600, check=True)
            res = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append({"model": name, "setting": setting, "file_bytes": path.stat().st_size, **res})
    print("| model | setting | file MiB | weights measured MiB | model file resident MiB (load / decode) | "
          "anonymous MiB | process RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        a, d = r["after_load"], r["after_decode"]
        print(f"| {r['model']} | {r['setting']} | {r['file_bytes'] / MIB:.0f} | {r['weights_measured'] / MIB:.0f} | "
              f"{a['model_file'] / MIB:.0f} / {d['model_file'] / MIB:.0f} | {d['anon'] / MIB:.0f} | {d['rss'] / MIB:.0f} |")
    args.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M"), "host": platform_line(), "rows": rows},
                                   indent=1))
    print(f"wrote {args.out}")
    return 0


def platform_line() -> str:
    try:
        model = next(l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                     if l.startswith("model name"))
    except (OSError, StopIteration):
        model = "unknown CPU"
    return f"{model}, {os.cpu_count()} CPUs"


if __name__ == "__main__":
    sys.exit(main())
