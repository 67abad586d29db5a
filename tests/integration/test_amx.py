"""Patch 0009 on a host with AMX (the setup build turns ggml's AMX backend on there): the weights
load into the AMX buffer, decodes of several rows no longer die with SIGILL (the tile configuration
GCC dropped), and batches of every kernel give, bit for bit, the logits of one-row decodes: 2-4 rows
patch 0009's vnni kernel, 5-32 rows of Q4_1/Q8_0 weights patch 0013's AMX rows kernel (16 rows a
pass; Gemma's K-quants: the one-row kernel per row up to 8 rows, upstream's AMX tiles above), 33
and more upstream's AMX tiles; each batch follows a 280-token prefill on upstream's tiles, so the
AMX rows kernel loads its tile configuration after theirs. Patch 0010: the weights measured are
what the buffers hold (the file plus the repacked copy of the tied output matrix), which is what
the estimate says. Skipped on hosts without AMX."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import numpy as np
import pytest

from appliance.config import parse_config
from appliance.engine import native
from appliance.engine.manager import shape_of
from appliance.resources import repack
from appliance.resources.estimate import estimate
from conftest import GEMMA3, SMOLLM2, model_entry
from test_exactness_probe import logits_after


AMX_BUFFER = re.compile(r"^\w+:\s+AMX model buffer size =\s+[0-9.]+ MiB")


@pytest.fixture(scope="module")
def amx_build():
    if not repack.build_has_amx():
        pytest.skip("this host or its llama.cpp build has no AMX")


@pytest.mark.parametrize("path", [SMOLLM2, GEMMA3], ids=["smollm2", "gemma3"])
def test_amx_weights_give_row_invariant_logits(amx_build, real_models, tmp_path: Path, caplog, path: Path):
    caplog.set_level(logging.DEBUG, logger=native.log.name)
    m = native.load(path, n_ctx_total=2048, n_seq_max=1, n_batch=512, n_threads=2, type_k="f16", type_v="f16",
                    flash_attn="on", cache_dir=tmp_path)
    try:
        assert any(AMX_BUFFER.match(r.getMessage().strip()) for r in caplog.records)
        tokens = [(7907 * i + 3) % m.n_vocab for i in range(320)]
        for width in (2, 3, 4, 5, 8, 9, 13, 16, 17, 20, 24, 32, 33):
            single, batched = logits_after(m, tokens, 280, width)
            assert all(np.array_equal(a, b) for a, b in zip(single, batched)), width
    finally:
        m.free()


@pytest.mark.parametrize("path", [SMOLLM2, GEMMA3], ids=["smollm2", "gemma3"])
def test_measured_weights_are_what_the_buffers_hold(amx_build, real_models, tmp_path: Path, path: Path):
    m = native.load(path, n_ctx_total=1024, n_seq_max=1, n_batch=256, n_threads=2, type_k="f16", type_v="f16",
                    flash_attn="on", cache_dir=tmp_path)
    try:
        est = estimate(shape_of(path), parse_config({"models": [model_entry("m", path)]}).models[0])
        copy = repack.repacked_output_bytes(shape_of(path))
        assert copy > 0.1 * path.stat().st_size  # both models tie a Q8_0 output matrix
        assert 0.97 < m.buffers.weights / est.weights < 1.03
    finally:
        m.free()
