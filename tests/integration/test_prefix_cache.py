"""The prefix cache through the real server: RAM hits, the disk tier across a restart, damaged
entries, a full disk, conversations, warm-up, and answers identical to cold runs."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import httpx
import pytest

from conftest import SMOLLM2, model_entry
from opshelp import small_tmpfs, wait_for

GPL = Path("/usr/share/common-licenses/GPL-3").read_text()
SYSTEM = "You answer questions about this license.\n\n" + GPL[2000:3600]


def chat(server, question: str, system: str = SYSTEM, max_tokens: int = 12, history: list | None = None) -> dict:
    messages = [{"role": "system", "content": system}, *(history or []), {"role": "user", "content": question}]
    r = httpx.post(server.base + "/v1/chat/completions", timeout=120,
                   json={"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def kv(server) -> dict:
    return httpx.get(server.base + "/v1/admin/kv/status").json()["models"]["m"]


def sched(server) -> dict:
    return httpx.get(server.base + "/v1/admin/scheduling/status").json()["models"]["m"]


def config(disk: Path, **kv_cache) -> dict:
    return {"models": [model_entry("m", SMOLLM2, n_ctx=2048, kv_cache={"disk": {"path": str(disk)}, **kv_cache})]}


@pytest.fixture(scope="module")
def disk(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kvdisk")


@pytest.fixture(scope="module")
def first(server_factory, disk):
    return server_factory(config(disk), "prefix-a")


def test_a_repeated_prefix_is_restored_from_ram_with_the_same_answer(first):
    cold = chat(first, "What does this say about copying?")
    assert kv(first)["misses"] == 1
    assert cold["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    prefill_before = sched(first)["prefill_tokens"]
    warm = chat(first, "What does this say about copying?")
    assert warm["choices"][0]["message"]["content"] == cold["choices"][0]["message"]["content"]
    status = kv(first)
    assert status["ram"]["hits"] >= 1
    prompt = warm["usage"]["prompt_tokens"]
    prefilled = sched(first)["prefill_tokens"] - prefill_before
    assert prefilled < 20 < prompt  # only the tail after the last saved block was prefilled
    assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt - prefilled


def test_another_question_on_the_same_system_prompt_reuses_it(first):
    before = sched(first)["prefix_tokens_restored"]
    answer = chat(first, "Who may distribute it?")
    assert sched(first)["prefix_tokens_restored"] - before > 300
    assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] == sched(first)["prefix_tokens_restored"] - before
    streamed = httpx.post(first.base + "/v1/completions", timeout=120, json={
        "model": "m", "prompt": SYSTEM, "max_tokens": 2, "stream": True, "stream_options": {"include_usage": True}})
    usage = [line for line in streamed.text.splitlines() if '"usage":{' in line][-1]
    assert '"prompt_tokens_details":{"cached_tokens":' in usage


def test_the_next_turn_of_a_conversation_restores_the_whole_previous_turn(first):
    q1 = "Summarise the first sentence."
    a1 = chat(first, q1, max_tokens=24)["choices"][0]["message"]["content"]
    before = sched(first)["prefix_tokens_restored"]
    second = chat(first, "And the second?", history=[{"role": "user", "content": q1},
                                                     {"role": "assistant", "content": a1}])
    restored = sched(first)["prefix_tokens_restored"] - before
    # more than the system prompt: the first turn's question and (most of) its answer too
    system_only = chat(first, "x", max_tokens=1)["usage"]["prompt_tokens"]
    assert restored > system_only, (restored, system_only, second["usage"])


def test_concurrent_requests_share_a_live_prefix(first):
    system = "Reply briefly.\n\n" + GPL[9000:10400]

    def one(i: int) -> dict:
        return chat(first, f"Question {i}: what is this part about?", system=system, max_tokens=4)

    before = sched(first)["prefix_live_hits"] + kv(first)["ram"]["hits"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(one, range(4)))
    assert all(r["choices"][0]["message"]["content"] for r in results)
    assert sched(first)["prefix_live_hits"] + kv(first)["ram"]["hits"] - before >= 2


def test_warm_then_hit(first):
    system = "A different system prompt.\n\n" + GPL[20000:21200]
    r = httpx.post(first.base + "/v1/admin/kv/warm", timeout=120,
                   json={"model": "m", "messages": [{"role": "system", "content": system}]})
    assert r.status_code == 200, r.text
    assert r.json()["cached_tokens"] > 200
    before = kv(first)["ram"]["hits"]
    chat(first, "Anything?", system=system, max_tokens=2)
    assert kv(first)["ram"]["hits"] == before + 1
    bad = httpx.post(first.base + "/v1/admin/kv/warm", json={"model": "m"})
    assert bad.status_code == 400
    assert httpx.post(first.base + "/v1/admin/kv/warm", json={"model": "nope", "prompt": "x y"}).status_code == 404


def test_a_restarted_server_restores_from_disk_with_the_same_answer(first, server_factory, disk):
    cold = chat(first, "What does this say about copying?")["choices"][0]["message"]["content"]
    first.stop()  # SIGTERM: queued disk writes are finished first
    assert list(disk.glob("*/*.kv"))
    second = server_factory(config(disk), "prefix-b")
    again = chat(second, "What does this say about copying?")["choices"][0]["message"]["content"]
    assert again == cold
    status = kv(second)
    assert status["disk"]["hits"] >= 1 and status["disk"]["entries"] >= 1
    second.stop()


def test_damaged_disk_entries_are_deleted_and_requests_still_succeed(server_factory, disk):
    files = sorted(disk.glob("*/*.kv"))
    assert files
    for i, f in enumerate(files):  # flip bytes in some, truncate the others
        data = bytearray(f.read_bytes())
        if i % 2:
            data[len(data) // 2] ^= 0xFF
        else:
            data = data[: len(data) // 3]
        f.write_bytes(bytes(data))
    srv = server_factory(config(disk), "prefix-c")
    answer = chat(srv, "What does this say about copying?")
    assert answer["choices"][0]["message"]["content"]
    status = kv(srv)
    assert status["counters"].get("corrupt_deleted", 0) >= 1
    assert status["disk"]["hits"] == 0
    srv.stop()


def test_a_full_disk_turns_the_tier_off_and_requests_still_succeed(server_factory, tmp_path):
    with small_tmpfs(tmp_path / "tiny", "256k") as mnt:
        srv = server_factory(config(mnt), "prefix-full")
        a = chat(srv, "What does this say about copying?")
        b = chat(srv, "What does this say about copying?")
        assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
        # disk writes wait until the server is quiet (resources/cores.py wait_quiet)
        wait_for(lambda: not kv(srv)["disk"]["enabled"], timeout=30)
        srv_status = kv(srv)
        assert srv_status["disk"]["error"].startswith("disk full")
        assert srv_status["ram"]["hits"] >= 1
        assert "disk tier" in srv.log() and "turned off" in srv.log()
        srv.stop()


def test_above_the_low_watermark_saved_conversations_spill_to_disk_and_come_back(server_factory, tmp_path):
    import time

    import yaml

    srv = server_factory(config(tmp_path / "spill"), "prefix-spill")
    q1 = "Summarise the first sentence."
    a1 = chat(srv, q1, max_tokens=16)["choices"][0]["message"]["content"]
    status = kv(srv)
    assert status["ram"]["entries"] >= 1
    httpx.post(srv.base + "/v1/admin/kv/warm", timeout=60, json={"model": "m", "prompt": "x y z"})  # drains writes
    vram = httpx.get(srv.base + "/v1/admin/vram/status").json()
    model_bytes = vram["models"][0]["total_bytes"]
    # a budget whose low watermark holds the model but not the model and its saved prefixes
    low_target = model_bytes + status["ram"]["bytes"] // 2
    cfg = yaml.safe_load(srv.config_path.read_text())
    cfg["vram"] = {"budget_mb": -(-low_target * 100 // 85 // (1 << 20)), "low_watermark": 85}
    srv.config_path.write_text(yaml.safe_dump(cfg))
    assert httpx.post(srv.base + "/v1/admin/config/reload", timeout=60).status_code == 200
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and kv(srv)["ram"]["entries"]:
        time.sleep(0.2)
    status = kv(srv)
    assert status["ram"]["entries"] == 0 and status["disk"]["entries"] >= 1, status
    events = httpx.get(srv.base + "/v1/admin/scheduling/status").json()["events"]
    assert any(e["event"] == "prefix_spill" for e in events)
    before = sched(srv)["prefix_tokens_restored"]
    chat(srv, "And the second?", max_tokens=4,
         history=[{"role": "user", "content": q1}, {"role": "assistant", "content": a1}])
    assert kv(srv)["disk"]["hits"] >= 1
    assert sched(srv)["prefix_tokens_restored"] - before > 300
    srv.stop()


def test_compressed_disk_entries_restore_after_a_restart(server_factory, tmp_path):
    raw_dir, packed_dir = tmp_path / "raw", tmp_path / "packed"
    sizes = {}
    for name, d, disk in (("raw", raw_dir, {}), ("packed", packed_dir, {"compress": "turbo3"})):
        cfg = config(d)
        cfg["models"][0]["kv_cache"]["disk"].update(disk)
        srv = server_factory(cfg, f"prefix-{name}")
        chat(srv, "What does this say about copying?", max_tokens=1)
        srv.stop()
        sizes[name] = sum(f.stat().st_size for f in d.glob("*/*.kv"))
    assert sizes["packed"] < 0.3 * sizes["raw"], sizes
    cfg = config(packed_dir)
    cfg["models"][0]["kv_cache"]["disk"]["compress"] = "turbo3"
    srv = server_factory(cfg, "prefix-packed-again")
    answer = chat(srv, "What does this say about copying?")
    assert answer["choices"][0]["message"]["content"]
    assert kv(srv)["disk"]["hits"] >= 1 and kv(srv)["disk"]["codec"] == "turbo3"
    srv.stop()


def test_a_flush_right_after_an_answer_leaves_nothing_saved(server_factory, tmp_path):
    # the finished conversation is saved after its answer went out; the flush runs between two
    # runner steps, so it can never come before that save
    srv = server_factory(config(tmp_path / "flush"), "prefix-flush")
    for question in ("What does this say about copying?", "Who may distribute it?"):
        answer = chat(srv, question)
        with httpx.stream("POST", srv.base + "/v1/chat/completions", timeout=120,
                          json={"model": "m", "max_tokens": 24, "stream": True, "temperature": 0,
                                "messages": [{"role": "system", "content": SYSTEM + GPL[4000:9000]},
                                             {"role": "user", "content": question}]}) as r:
            assert r.status_code == 200 and any("[DONE]" in line for line in r.iter_lines())
        r = httpx.post(srv.base + "/v1/admin/kv/flush", json={"model": "m"}, timeout=60)
        assert r.status_code == 200 and r.json() == {"flushed": ["m"]}
        status = kv(srv)
        assert status["ram"]["entries"] == 0 and status["disk"]["entries"] == 0, status
        before = sched(srv)["prefill_tokens"]
        again = chat(srv, question)  # cold again: the whole prompt is prefilled
        assert sched(srv)["prefill_tokens"] - before == again["usage"]["prompt_tokens"]
        assert again["choices"][0]["message"]["content"] == answer["choices"][0]["message"]["content"]
        httpx.post(srv.base + "/v1/admin/kv/flush", json={"model": "m"}, timeout=60)
    srv.stop()
    assert not list((tmp_path / "flush").glob("*/*.kv"))  # queued writes were dropped, not written


def test_a_flush_gives_the_saved_prefixes_ram_back_to_the_system(server_factory, tmp_path):
    # saved states are freed into malloc's arenas; without a trim they stay resident
    srv = server_factory(config(tmp_path / "flush-ram"), "prefix-flush-ram")

    def anonymous() -> int:
        return httpx.get(srv.base + "/v1/admin/vram/status").json()["process"]["anonymous_bytes"]

    for i in range(8):
        chat(srv, "What does this say?", system=f"Part {i} of the license.\n\n" + GPL[3000 * i:3000 * i + 2400],
             max_tokens=1)
    httpx.post(srv.base + "/v1/admin/kv/warm", timeout=60, json={"model": "m", "prompt": "x y z"})  # drains writes
    saved = kv(srv)["ram"]["bytes"]
    assert saved > 60 << 20, saved
    before = anonymous()
    assert httpx.post(srv.base + "/v1/admin/kv/flush", json={"model": "m"}, timeout=60).status_code == 200
    assert before - anonymous() > saved * 0.6, (before, anonymous(), saved)
    srv.stop()


def test_names_on_one_file_with_other_context_shapes_keep_apart_disk_entries(server_factory, tmp_path):
    # a state saved by a larger context (more cells a sequence) or for the other attention path
    # (V transposed) is refused by llama.cpp: such names once shared one directory, and after a
    # restart each indexed the other's entries, whose refusal stood where its own were saved
    entry = lambda name, **kw: model_entry(name, SMOLLM2, kv_cache={"disk": {"path": str(tmp_path)}}, **kw)  # noqa: E731
    srv = server_factory({"models": [entry("m", n_ctx=2048, n_parallel=2), entry("short", n_ctx=512, n_parallel=1),
                                     entry("no-fa", n_ctx=2048, n_parallel=2, flash_attn="off")]}, "prefix-shapes")
    status = httpx.get(srv.base + "/v1/admin/kv/status").json()["models"]
    paths = {status[name]["disk"]["path"] for name in ("m", "short")}
    assert len(paths) == 2 and all(Path(p).parent == tmp_path for p in paths)
    # without flash attention V is transposed: no state of it is read or written here, and the
    # cache says so (each save failed with a warning, at a 0 % hit rate, as if it were on)
    assert status["no-fa"]["enabled"] is False and "flash attention" in status["no-fa"]["error"]
    # a quantized V needs flash attention: refused up front, not after tearing the context down
    r = httpx.post(srv.base + "/v1/admin/kv/convert", json={"model": "no-fa", "mode": "q8_0"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["param"] == "mode", r.text
    r = httpx.post(srv.base + "/v1/admin/kv/convert", json={"model": "no-fa", "mode": "f16", "k": "q8_0"}, timeout=60)
    assert r.status_code == 200 and r.json()["to"] == ["q8_0", "f16"], r.text
    srv.stop()


def test_a_warm_prompt_longer_than_the_context_is_skipped_and_requests_are_untouched(server_factory, tmp_path):
    # it reached llama_decode, whose failure failed every sequence of that step: under generic the
    # request that loaded the model, each time it was loaded
    cfg = {"policy": {"strategy": "generic"},
           "inference": {"kv_cache": {"prefix": {"warm": ["You are brief.", "word " * 1500]}}},
           "models": [model_entry("m", SMOLLM2, n_ctx=512, kv_cache={"disk": {"path": str(tmp_path)}})]}
    srv = server_factory(cfg, "prefix-warm-long")
    for _ in range(2):
        r = httpx.post(srv.base + "/v1/chat/completions", timeout=120, json={
            "model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
        assert httpx.post(srv.base + "/v1/admin/models/unload", json={"model": "m"}, timeout=60).status_code in (200, 409)
        wait_for(lambda: httpx.post(srv.base + "/v1/admin/models/unload", json={"model": "m"},
                                    timeout=60).status_code == 200, timeout=30)
    assert "kv_cache.prefix.warm[1]" in srv.log_path.read_text()
    srv.stop()
