"""Faults through the real server, each with its documented outcome (README, Operations):
member model files deleted or corrupted before load, a file llama.cpp aborts the process on, a
stream cancelled mid-way, the KV disk directory made read-only mid-run, SIGTERM during 8 streams,
kill -9 and restart."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

import tiny_bert
from conftest import EIE, SMOLLM2, model_entry
from opshelp import audit_path, metric, wait_for
from tiny_llama import write_tiny_llama

NO_EOS = {"0": -100, "2": -100, "4": -100}  # SmolLM2's end tokens: generations run to max_tokens


def stream_completion(srv, out: list, first: threading.Event | None, max_tokens: int, prompt: str) -> None:
    try:
        with httpx.stream("POST", srv.base + "/v1/completions", timeout=180, json={
                "model": "a", "prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0,
                "logit_bias": NO_EOS, "stream_options": {"include_usage": True}}) as r:
            events = []
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if first is not None:
                        first.set()
            out.append((r.status_code, events))
    except httpx.HTTPError as e:
        out.append((None, [repr(e)]))


# ---- a model file deleted or corrupted before load ----------------------------------------------

@pytest.fixture(scope="module")
def faulty(server_factory, tmp_path_factory):
    d = tmp_path_factory.mktemp("faulty-models")
    deleted, corrupt = d / "deleted.gguf", d / "corrupt.gguf"
    shutil.copyfile(SMOLLM2, deleted)
    shutil.copyfile(SMOLLM2, corrupt)
    deleted.unlink()  # gone before the server loads it
    with open(corrupt, "r+b") as f:  # the header survives, the tensor data is cut short
        f.truncate(os.path.getsize(corrupt) // 3)
    kv = d / "kv"
    return server_factory({
        "models": [model_entry("a", SMOLLM2, n_ctx=512, threads=1,
                               kv_cache={"disk": {"path": str(kv)}, "prefix": {"block_tokens": 16}}),
                   model_entry("deleted", deleted, n_ctx=512), model_entry("corrupt", corrupt, n_ctx=512)],
        "groups": [{"name": "partial", "models": ["a", "deleted", "corrupt"], "fallback": "partial"},
                   {"name": "strict", "models": ["a", "corrupt"], "fallback": "strict"},
                   {"name": "replace", "models": ["a", "deleted"], "fallback": {"replace_with": "a"}}],
    }, "faulty")


def group(srv, name: str) -> httpx.Response:
    return httpx.post(srv.base + "/v1/batch/execute", timeout=120, json={
        "group": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})


def test_member_model_deleted_or_corrupted_before_load(faulty):
    health = httpx.get(faulty.base + "/health")
    assert health.status_code == 503 and health.json()["status"] == "degraded"
    models = health.json()["models"]
    assert models["a"] == {"state": "ready"}
    assert models["deleted"]["state"] == "failed" and "not found" in models["deleted"]["error"]
    assert models["corrupt"]["state"] == "failed"  # llama.cpp's reason, not its generic last line
    assert models["corrupt"]["error"].startswith("corrupt.gguf is not a model llama.cpp can read: tensor '")
    assert models["corrupt"]["error"].endswith("data is not within the file bounds, model is corrupted or incomplete")
    r = group(faulty, "partial")  # partial: the good member answers, the others are reported
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["complete"] is False
    assert [m["status"] for m in body["members"]] == ["ok", "failed", "failed"]
    r = group(faulty, "strict")  # strict: the whole request fails, with every member's result
    assert r.status_code == 502 and r.json()["error"]["code"] == "group_failed"
    r = group(faulty, "replace")  # replace_with: the failed member's answer comes from the backup
    assert r.status_code == 200 and r.json()["complete"] is True
    assert r.json()["members"][1]["status"] == "replaced"
    r = httpx.post(faulty.base + "/v1/chat/completions", json={
        "model": "corrupt", "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 503 and r.json()["error"]["code"] == "model_not_ready"
    m = httpx.get(faulty.base + "/metrics").text
    assert metric(m, "eie_model_load_failures_total", model="deleted") == 1
    assert metric(m, "eie_model_load_failures_total", model="corrupt") == 1
    assert metric(m, "eie_model_state", model="corrupt", state="failed") == 1
    assert metric(m, "eie_group_executions_total", group="partial", outcome="partial") == 1
    assert metric(m, "eie_group_executions_total", group="strict", outcome="failed") == 1
    assert metric(m, "eie_group_fallbacks_total", group="replace", fallback="replace_with") == 1


def test_a_file_llama_cpp_aborts_on_fails_alone(server_factory, tmp_path, monkeypatch):
    """A vocabulary with a token written twice fails an assertion in llama.cpp, which aborts the
    process that reads it. The server reads a header in a child first (engine/gguf_header.py): the
    model fails with the assertion named, on demand and in discover, and nothing else stops."""
    monkeypatch.setattr(tiny_bert, "vocabulary", lambda real=tiny_bert.vocabulary: [*real(), "\u2581cat"])
    tiny_bert.write_tiny_bert(tmp_path / "twice.gguf")
    write_tiny_llama(tmp_path / "heads.gguf", n_head_kv=3)  # aborts when llama.cpp builds a context's graphs
    shutil.copyfile(SMOLLM2, tmp_path / "good.gguf")
    srv = server_factory({
        "model_dir": str(tmp_path),
        "policy": {"strategy": "generic"},
        "models": [model_entry("a", "good.gguf", n_ctx=512), model_entry("later", "twice.gguf", embedding=True),
                   model_entry("heads", "heads.gguf", n_ctx=256)],
    }, "aborting")
    r = httpx.post(srv.base + "/v1/completions", json={"model": "heads", "prompt": "Hi", "max_tokens": 4})
    assert r.status_code == 503 and "GGML_ASSERT(ggml_can_mul_mat(k, q))" in r.text, r.text
    r = httpx.post(srv.base + "/v1/embeddings", json={"model": "later", "input": "the cat"})
    assert r.status_code == 503 and "GGML_ASSERT(id_to_token.size() == token_to_id.size())" in r.text, r.text
    r = httpx.post(srv.base + "/v1/admin/models/load", json={"model": "heads"})  # (was a 500 with a success's shape)
    assert r.status_code == 503 and r.json()["error"]["code"] == "load_failed", r.text
    assert "GGML_ASSERT(ggml_can_mul_mat(k, q))" in r.json()["error"]["message"]
    found = {m["path"]: m for m in httpx.get(srv.base + "/v1/admin/models/discover").json()["models"]}
    assert "llama.cpp aborted reading twice.gguf: GGML_ASSERT" in found["twice.gguf"]["error"]
    assert found["good.gguf"]["architecture"] == "llama"
    r = httpx.post(srv.base + "/v1/completions", json={"model": "a", "prompt": "Hi", "max_tokens": 4})
    assert r.status_code == 200, r.text
    health = httpx.get(srv.base + "/health").json()["models"]
    assert health["a"] == {"state": "ready"} and health["later"]["state"] == "failed"
    assert srv.proc.poll() is None


def test_request_cancelled_mid_stream_frees_its_slot(faulty):
    with httpx.stream("POST", faulty.base + "/v1/completions", timeout=120, json={
            "model": "a", "prompt": "Once upon a time", "max_tokens": 400, "stream": True,
            "logit_bias": NO_EOS}) as r:
        it = r.iter_lines()
        got = [line for line, _ in zip(it, range(6)) if line.startswith("data: ")]
        assert got  # mid-stream: then the client goes away
    m = wait_for(lambda: (t := httpx.get(faulty.base + "/metrics").text)
                 and metric(t, "eie_sequences_ended_total", model="a", reason="cancelled") >= 1 and t, 30)
    assert metric(m, "eie_running_sequences", model="a") == 0
    assert metric(m, "eie_generated_tokens_total", model="a") < 400 * 2
    r = httpx.post(faulty.base + "/v1/completions", json={"model": "a", "prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert r.status_code == 200


def _read_only(path: Path):
    """Make `path` read-only for real (a read-only bind mount; root ignores file modes)."""
    r = subprocess.run(["mount", "--bind", str(path), str(path)], capture_output=True)
    if r.returncode == 0:
        r = subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], capture_output=True)
        if r.returncode == 0:
            return lambda: subprocess.run(["umount", str(path)], check=True)
        subprocess.run(["umount", str(path)])
    if os.geteuid() != 0:
        path.chmod(0o555)
        return lambda: path.chmod(0o755)
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0:
        return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)
    pytest.skip("cannot make a directory read-only here (no bind mount, no chattr)")


def chat(srv, content: str) -> httpx.Response:
    return httpx.post(srv.base + "/v1/chat/completions", timeout=120, json={
        "model": "a", "max_tokens": 4, "temperature": 0,
        "messages": [{"role": "system", "content": "You are a helpful assistant who answers briefly. " * 3},
                     {"role": "user", "content": content}]})


def kv_disk(srv) -> dict:
    return httpx.get(srv.base + "/v1/admin/kv/status").json()["models"]["a"]["disk"]


def test_kv_directory_made_read_only_mid_run(faulty):
    assert chat(faulty, "first question").status_code == 200
    wait_for(lambda: kv_disk(faulty)["entries"] >= 1)
    kv_dir = Path(kv_disk(faulty)["path"])
    restore = _read_only(kv_dir)
    try:
        for i in range(3):
            assert chat(faulty, f"another question number {i}").status_code == 200
        disk = wait_for(lambda: (d := kv_disk(faulty))["error"] and d)
        assert disk["enabled"] is False
        assert "read-only" in disk["error"] or "permission" in disk["error"]
        r = chat(faulty, "first question")  # still answered (RAM tier)
        assert r.status_code == 200
        m = httpx.get(faulty.base + "/metrics").text
        assert metric(m, "eie_prefix_cache_disk_errors_total", model="a") >= 1
        assert httpx.get(faulty.base + "/health").json()["models"]["a"]["state"] == "ready"
    finally:
        restore()


# ---- SIGTERM -------------------------------------------------------------------------------------

def _drain_server(server_factory, name: str, grace: float):
    return server_factory({
        "server": {"drain_grace_s": grace},
        "audit": {"path": "audit.log"},
        "models": [model_entry("a", SMOLLM2, n_ctx=512, n_parallel=8)],
    }, name)


def _start_streams(srv, n: int, max_tokens: int) -> tuple[list, list[threading.Thread]]:
    out: list = []
    firsts = [threading.Event() for _ in range(n)]
    threads = [threading.Thread(target=stream_completion, args=(srv, out, firsts[i], max_tokens, f"Story {i}:"))
               for i in range(n)]
    for t in threads:
        t.start()
    for f in firsts:
        assert f.wait(120)
    return out, threads


def test_sigterm_during_8_streams_drains_them_and_exits_0(server_factory):
    srv = _drain_server(server_factory, "drain", 300)  # long enough on a loaded machine
    out, threads = _start_streams(srv, 8, 32)
    srv.proc.send_signal(signal.SIGTERM)
    health = wait_for(lambda: (r := httpx.get(srv.base + "/health")).status_code == 503 and r, 10)
    assert health.json()["status"] == "draining"
    r = httpx.post(srv.base + "/v1/completions", json={"model": "a", "prompt": "late", "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["code"] == "draining" and r.headers["retry-after"]
    for t in threads:
        t.join(300)
    assert srv.proc.wait(60) == 0
    assert len(out) == 8
    for status, events in out:
        assert status == 200 and events[-1] == "[DONE]", events[-3:]
        usage = json.loads(events[-2]).get("usage")
        assert usage and usage["completion_tokens"] == 32, events[-3:]  # every stream finished in full
        assert any(json.loads(e)["choices"] and json.loads(e)["choices"][0]["finish_reason"] == "length"
                   for e in events[:-1])
    recs = [json.loads(x) for x in audit_path(srv).read_text().splitlines()]
    drain = [r for r in recs if r.get("event") == "drain"]
    assert drain and drain[0]["in_flight_at_start"] == 8 and drain[0]["aborted"] == 0
    assert recs[-1].get("event") == "stop"
    assert subprocess.run([str(EIE), "audit", "verify", str(audit_path(srv))]).returncode == 0
    # the KV disk writer was flushed: each finished conversation is on disk
    kv_dir = srv.config_path.parent / f"{srv.config_path.stem}-cache" / "kv"
    assert len(list(kv_dir.rglob("*.kv"))) == 8


def _streams_end_with_shutdown(srv, n: int, signals: tuple[int, ...], within_s: float) -> None:
    """`n` long streams, then `signals` (0.3 s apart): the process exits 0 within `within_s` and
    every stream ends with the in-band shutting_down error and [DONE]."""
    out, threads = _start_streams(srv, n, 480)
    t0 = time.monotonic()
    for sig in signals:
        srv.proc.send_signal(sig)
        time.sleep(0.3)
    for t in threads:
        t.join(60)
    assert srv.proc.wait(60) == 0
    assert time.monotonic() - t0 < within_s
    assert len(out) == n
    for status, events in out:
        assert status == 200 and events[-1] == "[DONE]", events[-3:]
        assert json.loads(events[-2])["error"]["code"] == "shutting_down", events[-3:]


def test_sigterm_past_the_grace_period_ends_streams_with_an_error_and_exits_0(server_factory):
    _streams_end_with_shutdown(_drain_server(server_factory, "drain-short", 1), 8, (signal.SIGTERM,), 30)


@pytest.mark.parametrize("signals", [(signal.SIGINT,), (signal.SIGTERM, signal.SIGTERM)])
def test_sigint_or_a_second_sigterm_stops_now_and_ends_streams_with_an_error(server_factory, signals):
    # it waited uvicorn's 10 s for the open connections, then cut the streams mid-body (no error,
    # no [DONE], a traceback each in the log)
    srv = _drain_server(server_factory, f"stop-now-{len(signals)}", 300)
    _streams_end_with_shutdown(srv, 4, signals, 8)
    assert "Exception in ASGI application" not in srv.log_path.read_text()


# ---- kill -9 and restart -------------------------------------------------------------------------

def test_kill_9_and_restart_keep_the_kv_disk_tier_and_the_audit_chain(server_factory, tmp_path):
    kv = tmp_path / "kv"
    config = {"audit": {"path": "audit.log"},
              "models": [model_entry("a", SMOLLM2, n_ctx=512, threads=1, kv_cache={"disk": {"path": str(kv)}})]}
    srv = server_factory(config, "crash")
    for i in range(3):
        assert chat(srv, f"question {i}").status_code == 200
    wait_for(lambda: kv_disk(srv)["entries"] >= 3)
    audit = audit_path(srv)
    wait_for(lambda: audit.exists() and len(audit.read_text().splitlines()) >= 4)
    srv.proc.kill()  # SIGKILL: no drain, no flush
    srv.proc.wait()
    files_before = sorted(p.name for p in kv.rglob("*.kv"))  # one directory per model identity
    assert files_before
    assert subprocess.run([str(EIE), "audit", "verify", str(audit)]).returncode == 0
    # an older build's or model version's directory, unused for 8 days, goes at the next start
    (own,) = [d for d in kv.iterdir() if d.is_dir()]
    shutil.copytree(own, stale := kv / ("ab" * 16))
    os.utime(stale, (time.time(), time.time() - 8 * 86400))

    srv.start()
    srv.wait_settled()
    assert not stale.exists() and own.is_dir()
    disk = kv_disk(srv)
    assert disk["enabled"] and disk["entries"] == len(files_before)  # every whole entry is back
    assert chat(srv, "question 1").status_code == 200  # the same conversation: restored from disk
    m = httpx.get(srv.base + "/metrics").text
    assert metric(m, "eie_prefix_cache_hits_total", model="a", tier="disk") >= 1
    srv.stop()
    out = subprocess.run([str(EIE), "audit", "verify", str(audit)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout
    recs = [json.loads(x) for x in audit.read_text().splitlines()]
    assert [r["event"] for r in recs if r["kind"] == "lifecycle"] == ["start", "start", "drain", "stop"]
