"""Patch 0011: after a load, the pages of the model file that only other buffers needed (weights
repacked into ggml's AMX or CPU_REPACK buffer, a GPU's layers) leave the process's memory. They
were read once to be copied, and stayed resident: SmolLM2 on an AMX Xeon kept 63 MiB of its 93 MiB
file resident for tensors the AMX buffer holds in its own copy (file pages of the process: 113 MiB
with the libraries, 50 with the patch); ggml-org/llama.cpp#16761 reports RSS nearly doubled with
CPU_REPACK. The mapping's resident pages must be what the mapped buffer holds
(patch 0010's line), also after a decode: inference never reads the dropped pages."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import llama_cpp as lc
import pytest

from appliance.engine import native
from conftest import GEMMA3, SMOLLM2, copy_model

HOLDS = re.compile(r"^\w+:\s+\S+_Mapped\s+model buffer holds\s+(?P<mib>[0-9.]+) MiB")
SPAN = re.compile(r"^\w+:\s+\S+_Mapped\s+model buffer size =\s+(?P<mib>[0-9.]+) MiB")
DROPPED = re.compile(r"dropped (?P<mib>[0-9.]+) MiB of mapped file pages")
MIB = 1024 * 1024


def resident_bytes_of(path: Path) -> int:
    """Resident bytes of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if re.match(r"^[0-9a-f]+-[0-9a-f]+ ", line):
            inside = len(fields) >= 6 and fields[5] == str(path)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1]) * 1024
    return total


def mib(pattern: re.Pattern, messages: list[str]) -> float:
    return sum(float(m.group("mib")) for m in map(pattern.search, messages) if m)


@pytest.mark.parametrize("path", [SMOLLM2, GEMMA3], ids=["smollm2", "gemma3"])
def test_pages_other_buffers_copied_leave_memory(real_models, tmp_path: Path, caplog, path: Path):
    model = copy_model(path, tmp_path)  # a path no other load in this process maps
    caplog.set_level(logging.DEBUG, logger=native.log.name)
    m = native.load(model, n_ctx_total=512, n_seq_max=1, n_batch=64, n_threads=2, type_k="f16", type_v="f16",
                    flash_attn="on", cache_dir=tmp_path)
    try:
        messages = [r.getMessage().strip() for r in caplog.records]
        held, span = mib(HOLDS, messages) * MIB, mib(SPAN, messages) * MIB
        assert held > 0.1 * path.stat().st_size, messages
        if span - held < 2 * MIB:
            pytest.skip(f"on this host no weights inside the mapped span went to other buffers ({span / MIB:.0f} MiB)")
        assert mib(DROPPED, messages) * MIB > 0.9 * (span - held)
        # pages cut by a tensor boundary stay: one on each side of each run of dropped tensors
        slack = 2 * MIB
        assert resident_bytes_of(model) <= held + slack, (resident_bytes_of(model) / MIB, held / MIB)
        batch = lc.llama_batch_init(8, 0, 1)
        for i in range(8):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = 100 + i, i, 1, int(i == 7)
            batch.seq_id[i][0] = 0
        batch.n_tokens = 8
        try:
            assert lc.llama_decode(m.ctx, batch) == 0
        finally:
            lc.llama_batch_free(batch)
        assert resident_bytes_of(model) <= held + slack
    finally:
        m.free()
