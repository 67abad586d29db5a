"""Patch 0011: after a load, the pages of the model file the process does not need resident leave
its memory: those of tensors that other buffers copied (weights repacked into ggml's AMX or
CPU_REPACK buffer, a GPU's layers), and the token embeddings' where the output layer is not that
same tensor (they are then read a row per token). They were read once, at load, and stayed
resident: SmolLM2 on an AMX Xeon kept its 92 MiB of tensors resident, and needs none of them
(process RSS 277 -> 186 MiB); ggml-org/llama.cpp#16761 reports RSS nearly doubled with CPU_REPACK.
The mapping's resident pages must be what the mapped buffer holds less the embeddings' (when
dropped), also after a decode: inference reads no dropped page but a few embedding rows."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import llama_cpp as lc
import numpy as np
import pytest

from appliance.engine import native
from appliance.engine.manager import shape_of
from appliance.resources import repack
from conftest import GEMMA3, SMOLLM2, copy_model

HOLDS = re.compile(r"^\w+:\s+\S+_Mapped\s+model buffer holds\s+(?P<mib>[0-9.]+) MiB")
SPAN = re.compile(r"^\w+:\s+\S+_Mapped\s+model buffer size =\s+(?P<mib>[0-9.]+) MiB")
DROPPED = re.compile(r"dropped (?P<mib>[0-9.]+) MiB of mapped file pages that other buffers copied, "
                     r"(?P<embd>[0-9.]+) MiB of token embeddings")
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


def mib(pattern: re.Pattern, messages: list[str], group: str = "mib") -> float:
    return sum(float(m.group(group)) for m in map(pattern.search, messages) if m)


@pytest.mark.parametrize("path", [SMOLLM2, GEMMA3], ids=["smollm2", "gemma3"])
def test_pages_not_needed_leave_memory(real_models, tmp_path: Path, caplog, monkeypatch, path: Path):
    model = copy_model(path, tmp_path)  # a path no other load in this process maps
    caplog.set_level(logging.DEBUG, logger=native.log.name)
    m = load(model, tmp_path)
    try:
        messages = [r.getMessage().strip() for r in caplog.records]
        held, span = mib(HOLDS, messages) * MIB, mib(SPAN, messages) * MIB
        assert held > 0.1 * path.stat().st_size, messages
        copied, embd = mib(DROPPED, messages) * MIB, mib(DROPPED, messages, "embd") * MIB
        assert copied > 0.9 * (span - held) - MIB, messages
        # Both models tie their output to the embeddings: these leave only where another buffer
        # (AMX, CPU_REPACK) took the output layer; otherwise the output matmul reads all of them.
        tied_bytes = shape_of(path).tied_output_bytes
        if repack.repacked_output_bytes(shape_of(path)) > 0:
            assert embd > tied_bytes - MIB, messages
        else:
            assert embd == 0, messages
        # pages cut by a tensor boundary stay: one on each side of each run of dropped tensors
        slack = 2 * MIB
        assert resident_bytes_of(model) <= held - embd + slack, (resident_bytes_of(model) / MIB, held / MIB)
        logits = last_logits(m)
        # the 8 tokens' embedding rows fault in again (a page or two each), nothing else
        assert resident_bytes_of(model) <= held - embd + slack + 8 * 8192
    finally:
        m.free()
    # and they are the rows the file holds: the same logits as with every page kept
    monkeypatch.setenv("EIE_KEEP_COPIED_PAGES", "1")
    kept = load(model, tmp_path)
    try:
        assert resident_bytes_of(model) > held - MIB
        assert np.array_equal(last_logits(kept), logits)
    finally:
        kept.free()


def load(model: Path, cache_dir: Path) -> native.LoadedModel:
    return native.load(model, n_ctx_total=512, n_seq_max=1, n_batch=64, n_threads=2, type_k="f16", type_v="f16",
                       flash_attn="on", cache_dir=cache_dir)


def last_logits(m: native.LoadedModel) -> np.ndarray:
    """Logits after 8 tokens spread over the vocabulary (their embedding rows in pages of their own)."""
    batch = lc.llama_batch_init(8, 0, 1)
    try:
        for i in range(8):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = 100 + 997 * i, i, 1, int(i == 7)
            batch.seq_id[i][0] = 0
        batch.n_tokens = 8
        assert lc.llama_decode(m.ctx, batch) == 0
        return np.ctypeslib.as_array(lc.llama_get_logits_ith(m.ctx, 7), shape=(m.n_vocab,)).copy()
    finally:
        lc.llama_batch_free(batch)
