"""Why an adapter file is not tried in a child process first, as a model's GGUF is: llama.cpp's
LoRA loader refuses a file it cannot read instead of aborting. Mutated adapters (random bytes,
mostly in the header and tensor table) are each loaded onto SmolLM2 in a child process and, where
llama.cpp takes them, applied to a decode: none may end the process."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

from conftest import SMOLLM2
from lora_adapter import write_lora

CHILD = """
import ctypes, sys
import llama_cpp as lc
from appliance.engine import native
native.init_backend()
model = lc.llama_model_load_from_file(sys.argv[1].encode(), lc.llama_model_default_params())
params = lc.llama_context_default_params()
params.n_ctx, params.n_batch, params.n_threads, params.n_threads_batch = 64, 64, 1, 1
for path in sys.argv[2:]:
    handle = lc.llama_adapter_lora_init(model, path.encode())
    if not handle:
        print("refused", flush=True)
        continue
    ctx = lc.llama_init_from_model(model, params)
    lc.llama_set_adapters_lora(ctx, (lc.llama_adapter_lora_p_ctypes * 1)(handle), 1, (ctypes.c_float * 1)(1.0))
    rc = lc.llama_decode(ctx, lc.llama_batch_get_one((lc.llama_token * 4)(1, 2, 3, 4), 4))
    print("decoded" if rc == 0 else f"decode {rc}", flush=True)
    lc.llama_free(ctx)
"""


def test_mutated_adapters_are_refused_or_decode_and_never_end_the_process(tmp_path: Path):
    base = tmp_path / "base.gguf"
    write_lora(SMOLLM2, base, rank=8, strength=0.3)
    data = base.read_bytes()
    rng = random.Random(42)
    files = []
    for i in range(60):
        buf = bytearray(data)
        for _ in range(rng.choice([1, 1, 2, 4])):
            off = rng.randrange(min(len(buf), 8192) if rng.random() < 0.8 else len(buf))
            buf[off] = rng.randrange(256)
        files.append(tmp_path / f"m{i}.gguf")
        files[-1].write_bytes(bytes(buf))
    outcomes = []
    for chunk in (files[k:k + 10] for k in range(0, len(files), 10)):  # a child per 10: an abort names its file
        proc = subprocess.run([sys.executable, "-c", CHILD, str(SMOLLM2), *map(str, chunk)], capture_output=True,
                              text=True, timeout=300, env={**os.environ, "GGML_NO_BACKTRACE": "1"})
        lines = proc.stdout.splitlines()
        assert proc.returncode == 0, (chunk[len(lines)].name, proc.returncode, proc.stderr[-400:])
        outcomes += lines
    assert len(outcomes) == len(files) and "refused" in outcomes and "decoded" in outcomes, outcomes
