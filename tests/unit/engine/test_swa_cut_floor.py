"""`kv_cache.sliding_window: window`: once llama.cpp may have reused a sequence's window cells, the
runner never cuts that sequence (or a copy of it) back past them (engine/runner.py, cut_floor).

A live prefix hit happens only while two requests overlap, which a test cannot time through the
server, so `_prefix_start` runs here on a stand-in runner, with llama.cpp's two memory calls
recorded instead of made."""

from __future__ import annotations

import collections
from types import SimpleNamespace

import pytest

from appliance.engine import runner as runner_module
from appliance.engine.runner import ModelRunner

BLOCK = 16


def stand_in(window: int, donor_floor: int, calls: list):
    keys = [bytes([i]) for i in range(40)]  # 40 blocks of the same prompt prefix
    donor = SimpleNamespace(prefix_keys=keys, seq_id=0, n_prefilled=40 * BLOCK, cut_floor=donor_floor,
                            migrated=False)
    prefix = SimpleNamespace(keys=lambda prompt, adapters=b"": keys, block=BLOCK,
                             store=SimpleNamespace(contains=lambda k: False),
                             restore=lambda *a: (calls.append(("restore",)) or (0, None)))
    seq = SimpleNamespace(req=SimpleNamespace(prompt=[0] * (41 * BLOCK)), prefix_keys=None, save_at=0, seq_id=1,
                          n_prefilled=0, pos=0, restored=0, cut_floor=0)
    runner = SimpleNamespace(prefix=prefix, _active=[donor, seq], _mem=None, swa_window=window, kv_types=("f16", "f16"),
                             loaded=SimpleNamespace(ctx=None), stats=collections.Counter(),
                             _adapter_identity=lambda seq: b"")
    return runner, seq


@pytest.fixture
def calls(monkeypatch) -> list:
    recorded: list = []
    monkeypatch.setattr(runner_module.lc, "llama_memory_seq_cp", lambda *a: recorded.append(("cp", *a[1:])))
    monkeypatch.setattr(runner_module.lc, "llama_memory_seq_rm", lambda *a: recorded.append(("rm", *a[1:])))
    return recorded


def test_a_live_prefix_is_copied_and_cut_where_no_window_cell_was_reused(calls):
    runner, seq = stand_in(window=512, donor_floor=600, calls=calls)
    ModelRunner._prefix_start(runner, seq)
    assert calls[:2] == [("cp", 0, 1, -1, -1), ("rm", 1, 640, -1)]  # 40 blocks: 640 >= the donor's floor
    assert (seq.n_prefilled, seq.cut_floor, runner.stats["prefix_live_hits"]) == (640, 600, 1)


def test_a_live_prefix_that_would_cut_past_reused_window_cells_is_not_taken(calls):
    runner, seq = stand_in(window=512, donor_floor=641, calls=calls)
    ModelRunner._prefix_start(runner, seq)
    assert calls == [("restore",)]  # no copy: the saved tiers are asked instead
    assert (seq.n_prefilled, runner.stats["prefix_live_hits"], runner.stats["prefix_misses"]) == (0, 0, 1)


@pytest.mark.parametrize("window,start,floor", [(0, 5000, 0), (512, 511, 0), (512, 512, 512), (512, 900, 900)])
def test_a_decode_from_the_window_on_raises_the_floor(window, start, floor):
    seq = SimpleNamespace(cut_floor=0)
    ModelRunner._may_reuse_cells(SimpleNamespace(swa_window=window), seq, start)
    assert seq.cut_floor == floor
