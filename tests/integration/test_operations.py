"""Operations through the real server: /metrics, request ids and JSON logs, the audit trail,
keys from a hashed key file, admin refusals, limits, /openapi.json."""

from __future__ import annotations

import json
import subprocess
import threading
import time

import httpx
import pytest

from appliance.api.auth import key_line
from conftest import EIE, GEMMA3, SMOLLM2, model_entry
from opshelp import audit_path, has_family, metric, wait_for

USER, ADMIN, PLAIN = "user-key-aaaaaaaa", "admin-key-bbbbbbbb", "config-key-cccccccc"
SECRET = "the-prompt-text-must-not-reach-the-audit-trail"


def auth(key: str | None) -> dict:
    return {"Authorization": f"Bearer {key}"} if key else {}


@pytest.fixture(scope="module")
def ops(server_factory, tmp_path_factory):
    keys = tmp_path_factory.mktemp("opskeys") / "keys"
    keys.write_text(f"# hashed at rest\n{key_line('alice', USER)}\n{key_line('ops', ADMIN, 'admin')}\n")
    return server_factory({
        "server": {"api_keys": [PLAIN], "api_key_file": str(keys), "metrics_auth": "key",
                   "limits": {"max_tokens": 400, "max_prompt_tokens": 200, "concurrent_requests": 2}},
        "audit": {"path": "audit.log"},
        "models": [model_entry("a", SMOLLM2, n_ctx=512, threads=1),
                   model_entry("b", GEMMA3, n_ctx=512, threads=1)],
        "groups": [{"name": "pair", "models": ["a", "b"], "type": "parallel"}],
    }, "ops")


def chat(srv, key=USER, content=SECRET, **kw) -> httpx.Response:
    body = {"model": "a", "messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0, **kw}
    return httpx.post(srv.base + "/v1/chat/completions", json=body, headers=auth(key), timeout=120)


def test_openapi_describes_every_route_from_the_msgspec_schemas(ops):
    r = httpx.get(ops.base + "/openapi.json")
    assert r.status_code == 200
    doc = r.json()
    assert doc["openapi"].startswith("3.1")
    routes = {"/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/batch/execute", "/v1/chain/execute",
              "/health", "/metrics", "/openapi.json"}
    assert routes <= set(doc["paths"])
    assert {p for p in doc["paths"] if p.startswith("/v1/admin/")} == {
        "/v1/admin/vram/status", "/v1/admin/scheduling/status", "/v1/admin/models/load", "/v1/admin/models/unload",
        "/v1/admin/models/discover", "/v1/admin/kv/convert", "/v1/admin/kv/warm", "/v1/admin/kv/status",
        "/v1/admin/kv/flush", "/v1/admin/config/reload"}
    chat_op = doc["paths"]["/v1/chat/completions"]["post"]
    assert chat_op["requestBody"]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ChatRequest"}
    role = doc["components"]["schemas"]["ChatMessage"]["properties"]["role"]
    assert set(role["enum"]) == {"system", "developer", "user", "assistant", "tool", "function"}  # function: legacy
    assert doc["paths"]["/metrics"]["get"]["security"] == [{"bearer": []}]  # metrics_auth: key
    assert "security" not in doc["paths"]["/health"]["get"]


def test_metrics_cover_requests_tokens_latency_engine_groups_and_devices(ops):
    for _ in range(2):  # the same conversation twice: the second finds its prefix cached
        assert chat(ops).status_code == 200
    with httpx.stream("POST", ops.base + "/v1/chat/completions", headers=auth(USER), timeout=120, json={
            "model": "a", "stream": True, "max_tokens": 8, "temperature": 0,
            "messages": [{"role": "user", "content": "Count"}]}) as r:
        assert r.status_code == 200 and "[DONE]" in r.read().decode()
    g = httpx.post(ops.base + "/v1/batch/execute", headers=auth(USER), timeout=120, json={
        "group": "pair", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert g.status_code == 200, g.text
    assert chat(ops, model="nope").status_code == 404

    assert httpx.get(ops.base + "/metrics").status_code == 401  # metrics_auth: key
    r = httpx.get(ops.base + "/metrics", headers=auth(USER))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    t = r.text
    assert metric(t, "eie_requests_total", endpoint="/v1/chat/completions", model="a", status="200") >= 3
    assert metric(t, "eie_requests_total", endpoint="/v1/chat/completions", status="404") >= 1
    assert metric(t, "eie_time_to_first_token_seconds_count", model="a") >= 3
    assert metric(t, "eie_time_to_first_token_seconds_count", model="b") >= 1
    assert metric(t, "eie_inter_token_latency_seconds_count", model="a") >= 5
    assert metric(t, "eie_prompt_tokens_total", model="a") > 0
    assert metric(t, "eie_generated_tokens_total", model="a") >= 16
    assert metric(t, "eie_group_executions_total", group="pair", outcome="complete") >= 1
    # the group request counted once, under the group's name (once per member before)
    assert metric(t, "eie_requests_total", endpoint="/v1/batch/execute", model="pair") == 1
    assert metric(t, "eie_requests_total", endpoint="/v1/batch/execute") == 1
    assert metric(t, "eie_kv_cache_bytes", model="a", type_k="f16", type_v="f16") > 0
    assert metric(t, "eie_model_memory_bytes", model="b", kind="weights") > 0
    assert metric(t, "eie_model_loads_total", model="a") == 1
    assert metric(t, "eie_model_load_failures_total", model="a") == 0
    assert metric(t, "eie_prefix_cache_hits_total", model="a") >= 1
    assert metric(t, "eie_device_memory_bytes", state="total") > 0
    assert metric(t, "eie_sequence_slots", model="a") == 2
    for family in ("eie_queue_depth", "eie_running_sequences", "eie_speculative_drafted_tokens",
                   "eie_speculative_accepted_tokens", "eie_model_evictions", "eie_group_fallbacks",
                   "eie_prefix_cache_bytes", "eie_request_duration_seconds"):
        assert has_family(t, family), family


def test_a_client_that_hangs_up_has_every_cancelled_sequence_counted(ops):
    """n=2 streamed, the client gone after a few chunks: both sequences end as cancelled in the
    metrics (only the one whose end the request still read was counted: the metrics saw events
    as the request read them, and it stops reading when its client goes)."""
    def scrape() -> str:
        return httpx.get(ops.base + "/metrics", headers=auth(USER)).text

    before = scrape()
    for path, body in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "Write a long story"}]}),
                       ("/v1/completions", {"prompt": "Once upon a time"})):
        with httpx.stream("POST", ops.base + path, headers=auth(USER), timeout=120, json={
                "model": "a", "stream": True, "n": 2, "max_tokens": 300, "temperature": 0.8, "seed": 1, **body}) as r:
            for k, _ in enumerate(r.iter_lines()):
                if k > 8:
                    break
        wait_for(lambda: metric(scrape(), "eie_running_sequences", model="a") == 0)
    def cancelled(text: str) -> float:
        return metric(text, "eie_sequences_ended_total", model="a", reason="cancelled")

    after = wait_for(lambda: (lambda t: t if cancelled(t) - cancelled(before) >= 4 else None)(scrape()), 10)
    time.sleep(0.5)
    assert cancelled(scrape()) - cancelled(before) == 4
    ttft = "eie_time_to_first_token_seconds_count"
    assert metric(after, ttft, model="a") - metric(before, ttft, model="a") == 4
    # logged and audited as the client going away, with what was made for it (they said 200 ok
    # and 0 tokens: a client could make any answer look free by hanging up before its end)
    def hung_up() -> list[dict] | None:
        recs = [json.loads(x) for x in audit_path(ops).read_text().splitlines()]
        gone = [r for r in recs if r["kind"] == "request" and r.get("status") == 499]
        return gone[-2:] if len(gone) >= 2 else None

    for rec in wait_for(hung_up, 10):
        assert rec["outcome"] == "client_disconnected" and rec["prompt_tokens"] > 0, rec
        assert rec["completion_tokens"] >= 2, rec
    assert metric(scrape(), "eie_generated_tokens_total", model="a") - metric(before, "eie_generated_tokens_total",
                                                                              model="a") >= 8


def test_request_ids_are_echoed_or_made_and_logged_as_json(ops):
    r = httpx.post(
        ops.base + "/v1/chat/completions", headers={**auth(USER), "X-Request-Id": "trace-abc-123"}, timeout=120,
        json={"model": "a", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-abc-123"
    made = httpx.get(ops.base + "/v1/models", headers=auth(USER)).headers["x-request-id"]
    assert len(made) == 32
    err = httpx.post(ops.base + "/v1/chat/completions", headers=auth(USER), content=b"{")
    assert err.status_code == 400 and len(err.headers["x-request-id"]) == 32

    def logged():
        lines = [json.loads(x) for x in ops.log_path.read_text().splitlines() if x.startswith("{")]
        return [x for x in lines if x.get("request_id") == "trace-abc-123" and x["logger"] == "eie.access"]

    line = wait_for(logged)[0]
    assert line["status"] == 200 and line["models"] == ["a"] and line["key_id"] == "alice"
    assert line["completion_tokens"] >= 1


def test_audit_trail_records_who_what_and_outcome_but_no_prompt_text(ops):
    assert chat(ops).status_code == 200
    assert httpx.post(ops.base + "/v1/admin/kv/flush", headers=auth(ADMIN), json={"model": "a"}).status_code == 200
    # fixed-appliance refuses loads: the refusal is recorded with its code
    assert httpx.post(ops.base + "/v1/admin/models/load", headers=auth(ADMIN), json={"model": "b"}).status_code == 409
    assert httpx.post(ops.base + "/v1/admin/models/load", headers=auth(USER), json={"model": "a"}).status_code == 403
    path = audit_path(ops)

    def records():
        recs = [json.loads(x) for x in path.read_text().splitlines()]
        return recs if sum(r["kind"] == "admin" for r in recs) >= 3 else None

    recs = wait_for(records)
    assert SECRET not in path.read_text() and USER not in path.read_text() and ADMIN not in path.read_text()
    req = [r for r in recs if r["kind"] == "request" and r.get("key_id") == "alice" and r["status"] == 200]
    assert req and req[-1]["models"] == ["a"] and req[-1]["completion_tokens"] >= 1 and req[-1]["prompt_tokens"] > 0
    admin = [r for r in recs if r["kind"] == "admin"]
    assert admin[-3]["key_id"] == "ops" and admin[-3]["path"] == "/v1/admin/kv/flush"
    assert admin[-3]["action"] == {"model": "a"} and admin[-3]["outcome"] == "ok"
    assert admin[-2]["key_id"] == "ops" and admin[-2]["status"] == 409 and admin[-2]["outcome"] == "policy_refused"
    assert admin[-2]["action"] == {"model": "b"}
    assert admin[-1]["key_id"] == "alice" and admin[-1]["status"] == 403
    assert admin[-1]["outcome"] == "admin_key_required"
    assert recs[0]["kind"] == "lifecycle" and recs[0]["event"] == "start"
    out = subprocess.run([str(EIE), "audit", "verify", str(path)], capture_output=True, text=True)
    assert out.returncode == 0 and "chain intact" in out.stdout, out.stdout


ADMIN_CALLS = [("GET", "/v1/admin/vram/status"), ("GET", "/v1/admin/scheduling/status"),
               ("POST", "/v1/admin/models/load"), ("POST", "/v1/admin/models/unload"),
               ("GET", "/v1/admin/models/discover"), ("POST", "/v1/admin/kv/convert"), ("POST", "/v1/admin/kv/warm"),
               ("GET", "/v1/admin/kv/status"), ("POST", "/v1/admin/kv/flush"), ("POST", "/v1/admin/config/reload")]


def test_every_admin_endpoint_refuses_a_plain_key_and_no_key(ops):
    doc = httpx.get(ops.base + "/openapi.json").json()
    listed = {(m.upper(), p) for p, ops_ in doc["paths"].items() for m in ops_ if p.startswith("/v1/admin/")}
    assert listed == set(ADMIN_CALLS)  # the list below is every admin endpoint
    for method, path in ADMIN_CALLS:
        body = {"model": "a", "mode": "q8_0"} if method == "POST" else None
        for key, status in ((None, 401), ("wrong-key-zzzzzzzz", 401), (USER, 403), (PLAIN, 403)):
            r = httpx.request(method, ops.base + path, json=body, headers=auth(key), timeout=30)
            assert r.status_code == status, (method, path, key, r.text)
            assert r.json()["error"]["code"] in ("invalid_api_key", "admin_key_required")
    assert httpx.get(ops.base + "/v1/admin/kv/status", headers=auth(ADMIN)).status_code == 200
    assert httpx.get(ops.base + "/health").status_code == 200  # open for probes
    assert chat(ops, key=PLAIN).status_code == 200  # a plain key still serves
    assert chat(ops, key=None).status_code == 401


def test_limits_prompt_tokens_max_tokens_and_concurrency(ops):
    r = chat(ops, content="word " * 400)
    err = r.json()["error"]
    assert r.status_code == 400 and err["param"] == "messages" and err["code"] == "prompt_too_long"
    r = chat(ops, max_tokens=401)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    # concurrent_requests: 2 per key; two streams held open, the third request is refused
    opened, release = threading.Barrier(3), threading.Event()
    statuses = []

    def hold() -> None:
        with httpx.stream("POST", ops.base + "/v1/completions", headers=auth(USER), timeout=120, json={
                "model": "a", "prompt": "Once upon a time", "max_tokens": 400, "stream": True,
                "logit_bias": {"0": -100, "2": -100, "4": -100}}) as r:  # no end token: runs for seconds
            statuses.append(r.status_code)
            it = r.iter_lines()
            next(it)
            opened.wait(30)
            release.wait(60)
            for _ in it:
                pass

    threads = [threading.Thread(target=hold) for _ in range(2)]
    for t in threads:
        t.start()
    opened.wait(60)
    try:
        r = chat(ops)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["code"] == "concurrent_requests" and int(r.headers["retry-after"]) >= 1
        assert chat(ops, key=PLAIN).status_code == 200  # per key
    finally:
        release.set()
        for t in threads:
            t.join(60)
    assert statuses == [200, 200]
    assert chat(ops).status_code == 200  # released


def test_rate_limit_answers_429_with_retry_after(server_factory):
    srv = server_factory({"server": {"api_keys": [PLAIN], "limits": {"rate_per_minute": 3}},
                          "models": [model_entry("a", SMOLLM2, n_ctx=512, threads=1)]}, "rate")
    codes = [chat(srv, key=PLAIN, max_tokens=1).status_code for _ in range(4)]
    assert codes == [200, 200, 200, 429]
    r = chat(srv, key=PLAIN, max_tokens=1)
    assert r.json()["error"]["code"] == "rate_per_minute" and 1 <= int(r.headers["retry-after"]) <= 20
    m = httpx.get(srv.base + "/metrics").text  # metrics_auth defaults to open
    assert metric(m, "eie_limit_refusals_total", limit="rate_per_minute") == 2
    assert metric(m, "eie_requests_total", status="429") == 2


def test_audit_include_content_records_prompt_and_answer(server_factory):
    srv = server_factory({"audit": {"path": "audit.log", "include_content": True},
                          "models": [model_entry("a", SMOLLM2, n_ctx=512, threads=1)]}, "content")
    r = chat(srv, key=None, content="Tell me about owls")
    assert r.status_code == 200
    answer = r.json()["choices"][0]["message"]["content"]
    path = audit_path(srv)
    rec = wait_for(lambda: [json.loads(x) for x in path.read_text().splitlines()
                            if '"kind":"request"' in x])[-1]
    assert rec["content"]["messages"] == [{"role": "user", "content": "Tell me about owls"}]
    assert rec["content"]["output"] == {"a[0]": answer}
    assert rec["key_id"] is None  # no keys configured: open
    # every API's prompt fields: the Responses API's input and instructions, Anthropic's system
    # (left out), and a background response's answer (it had none)
    httpx.post(srv.base + "/v1/responses", timeout=60, json={
        "model": "a", "instructions": "SYS-RESP", "input": "U-RESP", "max_output_tokens": 3})
    httpx.post(srv.base + "/v1/messages", timeout=60, json={
        "model": "a", "system": "SYS-ANTH", "messages": [{"role": "user", "content": "U-ANTH"}], "max_tokens": 3})
    queued = httpx.post(srv.base + "/v1/responses", timeout=60, json={
        "model": "a", "input": "U-BG", "max_output_tokens": 3, "background": True}).json()

    def recorded() -> dict[str, dict] | None:
        recs = [json.loads(x) for x in path.read_text().splitlines() if '"kind":"request"' in x]
        by = {r["request_id"]: r for r in recs}
        return by if queued["id"] in by and "/v1/messages" in str(recs) else None

    by = wait_for(recorded)
    assert any(r.get("path") == "/v1/responses" and r["content"].get("input") == "U-RESP"
               and r["content"].get("instructions") == "SYS-RESP" for r in by.values()), by
    messages = next(r for r in by.values() if r.get("path") == "/v1/messages")
    assert messages["content"]["system"] == "SYS-ANTH"
    assert by[queued["id"]]["content"]["output"]  # its answer, made in the background


def test_sighup_reloads_the_config_like_the_admin_endpoint(server_factory):
    import signal

    import yaml

    srv = server_factory({"server": {"limits": {"max_tokens": 64}},
                          "models": [model_entry("a", SMOLLM2, n_ctx=512, threads=1)]}, "sighup")
    assert chat(srv, key=None, max_tokens=32).status_code == 200
    config = yaml.safe_load(srv.config_path.read_text())
    config["server"]["limits"]["max_tokens"] = 16
    srv.config_path.write_text(yaml.safe_dump(config))
    srv.proc.send_signal(signal.SIGHUP)
    r = wait_for(lambda: (r := chat(srv, key=None, max_tokens=32)).status_code == 400 and r, 10)
    assert r.json()["error"]["param"] == "max_tokens"
    srv.config_path.write_text("models: [")  # broken: logged, nothing changes
    srv.proc.send_signal(signal.SIGHUP)
    wait_for(lambda: "SIGHUP reload failed" in srv.log_path.read_text(), 10)
    assert chat(srv, key=None, max_tokens=16).status_code == 200
    assert chat(srv, key=None, max_tokens=17).status_code == 400
    assert srv.proc.poll() is None


def test_a_sighup_while_the_server_starts_does_not_end_it(server_factory):
    # SIGHUP's default action ended the process (exit 129) until the server's handler was set
    import signal

    srv = server_factory({"models": [model_entry("a", SMOLLM2, n_ctx=512, threads=1)]}, "sighup-early", wait=False)
    time.sleep(0.6)  # (past the interpreter's own start, which no handler can cover)
    for _ in range(4):
        srv.proc.send_signal(signal.SIGHUP)
        time.sleep(0.2)
    srv.wait_settled()
    assert srv.proc.poll() is None and chat(srv, key=None, max_tokens=4).status_code == 200
    srv.stop()


def test_hash_key_prints_a_key_file_line():
    out = subprocess.run([str(EIE), "hash-key", "bob", "--admin"], input="bob-secret-key\n", capture_output=True,
                         text=True)
    assert out.returncode == 0
    assert out.stdout.strip() == key_line("bob", "bob-secret-key", "admin")
    assert "bob-secret-key" not in out.stdout
    short = subprocess.run([str(EIE), "hash-key", "bob"], input="short\n", capture_output=True, text=True)
    assert short.returncode == 2
