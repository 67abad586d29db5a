"""Every designed error status, produced for real against a real server."""

from __future__ import annotations

import json
import threading
import time

import httpx
import openai
import pytest

from appliance.engine.manager import shape_of
from appliance.resources import repack
from conftest import SMOLLM2, model_entry
from opshelp import wait_for

KEY = "test-key-0123456789"


@pytest.fixture(scope="module")
def strict_server(server_factory, tmp_path_factory):
    """One slot and no queue, an API key, a small body limit, a broken and a missing model."""
    broken = tmp_path_factory.mktemp("broken") / "truncated.gguf"
    with open(SMOLLM2, "rb") as src, open(broken, "wb") as dst:
        dst.write(src.read(1 << 20))
    return server_factory(
        {
            "server": {"api_keys": [KEY], "limits": {"max_body_bytes": 8192, "max_tokens": 512},
                       "cors_origins": ["https://chat.example"]},
            "models": [
                model_entry("smollm2-135m", SMOLLM2, n_parallel=1, max_queue=0, n_ctx=512),
                model_entry("broken", broken),
                model_entry("missing", SMOLLM2.parent / "does-not-exist.gguf"),
            ],
        },
        "strict",
    )


def post(srv, path: str, body, key: str | None = KEY, **kw) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    if isinstance(body, (bytes, str)):
        return httpx.post(srv.base + path, content=body, headers={**headers, "content-type": "application/json"}, **kw)
    return httpx.post(srv.base + path, json=body, headers=headers, timeout=60, **kw)


def envelope(r: httpx.Response) -> dict:
    body = r.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}, body
    return body["error"]


def chat(model="smollm2-135m", **kw) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, **kw}


def test_health_reports_failed_models_with_reasons(strict_server):
    r = httpx.get(strict_server.base + "/health")
    assert r.status_code == 503
    body = r.json()
    assert body["status"] == "degraded"
    assert body["models"]["smollm2-135m"] == {"state": "ready"}
    assert body["models"]["broken"]["state"] == "failed" and body["models"]["broken"]["error"]
    assert body["models"]["missing"]["state"] == "failed"
    assert "not found" in body["models"]["missing"]["error"]


def test_healthy_models_still_serve_beside_failed_ones(strict_server):
    r = post(strict_server, "/v1/chat/completions", chat())
    assert r.status_code == 200, r.text
    # Ollama's model list names them all, the missing file with no size or digest
    listed = {m["name"]: m for m in httpx.get(strict_server.base + "/api/tags", headers={
        "Authorization": f"Bearer {KEY}"}).json()["models"]}
    assert listed["missing"]["size"] == 0 and listed["missing"]["digest"] == ""
    assert listed["smollm2-135m"]["size"] == SMOLLM2.stat().st_size


def test_503_for_a_failed_model(strict_server):
    for name in ("broken", "missing"):
        r = post(strict_server, "/v1/chat/completions", chat(name))
        assert r.status_code == 503
        err = envelope(r)
        assert err["code"] == "model_not_ready" and err["param"] == "model"


def test_401_without_or_with_a_bogus_key(strict_server):
    for key in (None, "bogus-key-000000"):
        r = post(strict_server, "/v1/chat/completions", chat(), key=key)
        assert r.status_code == 401
        assert envelope(r)["code"] == "invalid_api_key"
    assert httpx.get(strict_server.base + "/v1/models").status_code == 401
    assert httpx.get(strict_server.base + "/health").status_code == 503  # open for probes
    sdk = openai.OpenAI(base_url=strict_server.base + "/v1", api_key="wrong-key-1234", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        sdk.models.list()


def test_404_unknown_model_and_endpoint(strict_server):
    r = post(strict_server, "/v1/chat/completions", chat("no-such-model"))
    assert r.status_code == 404
    err = envelope(r)
    assert err["code"] == "model_not_found" and err["param"] == "model"
    r = post(strict_server, "/v1/nothing", chat())
    assert r.status_code == 404
    r = httpx.delete(strict_server.base + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 405 and set(r.headers["allow"].split(", ")) == {"GET", "HEAD", "POST"}


def test_413_body_too_large(strict_server):
    big = chat(messages=[{"role": "user", "content": "x" * 20000}])
    r = post(strict_server, "/v1/chat/completions", big)
    assert r.status_code == 413
    assert envelope(r)["code"] == "request_too_large"


@pytest.mark.parametrize(
    "body,param",
    [
        (chat(max_tokens=-1), "max_tokens"),
        (chat(max_tokens="ten"), "max_tokens"),
        (chat(temperature=5), "temperature"),
        ({"model": "smollm2-135m", "messages": []}, "messages"),
        ({"model": "smollm2-135m", "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        (chat(stop=[""]), "stop[0]"),
        (chat(max_tokens=100000), "max_tokens"),
        (chat(logit_bias={"abc": 1}), "logit_bias"),
        (chat(tools=[{"type": "function"}]), "tools[0].function"),
        (chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages[0].content[0].type"),
        (chat(messages=[{"role": "user", "content": [{"type": "text"}]}]), "messages[0].content[0].text"),
        (chat(messages=[{"role": "user", "content": [{"type": "text", "text": None}]}]), "messages[0].content[0].text"),
        (chat(messages=[{"role": "user", "content": "x"}, {"role": "assistant", "content": [{"type": "refusal"}]}]),
         "messages[1].content[0].refusal"),
        # the deprecated functions: checked as tools are, named as sent
        (chat(functions=[{"name": "f", "parameters": {"type": "object"}}], tools=[{"type": "function", "function": {"name": "f"}}]), "functions"),
        (chat(function_call="auto"), "function_call"),
        (chat(functions=[{"name": "f"}], function_call="sometimes"), "function_call"),
        (chat(functions=[{"name": "f"}], function_call={"name": "g"}), "function_call.name"),
        (chat(functions=[{"name": "f"}, {"name": "bad name"}]), "functions[1].name"),
        (chat(functions=[{"name": "f", "parameters": {"type": "object", "properties": {"n": {"type": "number", "multipleOf": 2}}}}]),
         "functions[0].parameters.properties.n.multipleOf"),
        (chat(messages=[{"role": "function", "content": "3"}]), "messages[0].name"),
        (chat(messages=[{"role": "user", "content": "x", "function_call": {"name": "f"}}]), "messages[0].function_call"),
        # OpenAI's fields that cannot be honoured are refused, not ignored
        (chat(modalities=["text", "audio"]), "modalities"),
        (chat(audio={"voice": "alloy", "format": "wav"}), "audio"),
        (chat(web_search_options={}), "web_search_options"),
    ],
)
def test_400_names_the_offending_field(strict_server, body, param):
    r = post(strict_server, "/v1/chat/completions", body)
    assert r.status_code == 400, r.text
    err = envelope(r)
    assert err["param"] == param, err
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe{}", b"[]", b'{"model": "smollm2-135m", "prompt": {"a": 1}}'])
def test_400_for_malformed_bodies(strict_server, raw):
    r = post(strict_server, "/v1/completions", raw)
    assert r.status_code == 400
    envelope(r)


def test_400_context_overflow(strict_server):
    long = "word " * 2000
    r = post(strict_server, "/v1/completions", {"model": "smollm2-135m", "prompt": long[:7000], "max_tokens": 4})
    assert r.status_code == 400
    err = envelope(r)
    assert err["code"] == "context_length_exceeded" and err["param"] == "prompt"
    r = post(strict_server, "/v1/completions", {"model": "smollm2-135m", "prompt": "Hello", "max_tokens": 512})
    assert r.status_code == 400 and envelope(r)["param"] == "max_tokens"


def test_429_when_queue_is_full_and_slot_freed_on_disconnect(strict_server):
    """One slot, no queue: a second request is refused; a disconnecting client frees the slot."""
    body = {"model": "smollm2-135m", "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "stream": True}
    got_first = threading.Event()
    release = threading.Event()

    def hold_stream() -> None:
        with httpx.Client(timeout=60) as c:
            with c.stream("POST", strict_server.base + "/v1/completions", json=body,
                          headers={"Authorization": f"Bearer {KEY}"}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        got_first.set()
                        if release.wait(30):
                            return  # closes the connection mid-stream

    t = threading.Thread(target=hold_stream)
    t.start()
    assert got_first.wait(30)
    r = post(strict_server, "/v1/completions", {"model": "smollm2-135m", "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 429
    assert r.headers["retry-after"] == "1"
    assert envelope(r)["code"] == "queue_full"
    release.set()
    t.join()
    deadline = time.monotonic() + 5  # the runner frees the sequence at its next step
    while time.monotonic() < deadline:
        r = post(strict_server, "/v1/completions", {"model": "smollm2-135m", "prompt": "Hi", "max_tokens": 2})
        if r.status_code == 200:
            break
        time.sleep(0.05)
    assert r.status_code == 200, r.text


def test_admin_status_needs_key_and_reports_measured_memory(strict_server):
    assert httpx.get(strict_server.base + "/v1/admin/vram/status").status_code == 401
    r = httpx.get(strict_server.base + "/v1/admin/vram/status", headers={"Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200
    body = r.json()
    cpu = body["devices"][0]
    assert cpu["device"] == "cpu" and cpu["total_bytes"] > cpu["free_bytes"] > 0
    models = {m["name"]: m for m in body["models"]}
    smol = models["smollm2-135m"]
    assert smol["state"] == "ready"
    # Weights as llama.cpp reports them are within a few percent of the estimate: the GGUF file, and
    # on a build with AMX the repacked copy of the tied output matrix (resources/repack.py).
    assert 0.95 < smol["weights_bytes"] / smol["estimate"]["weights_bytes"] < 1.05
    # (SmolLM2's tied Q8_0 embeddings: AMX packs them in 38/34 of their size; x86 has no CPU_REPACK
    # layout for Q8_0, ARM with dotprod one of the same size)
    features = repack.cpu_output_features() or {}
    arm_copy = features.get("DOTPROD") == "1" or features.get("MATMUL_INT8") == "1" and features.get("NEON") == "1"
    tied = shape_of(SMOLLM2).tied_output_bytes * (38 / 34 if repack.build_has_amx() else 1 if arm_copy else 0)
    assert abs(smol["estimate"]["weights_bytes"] - SMOLLM2.stat().st_size - tied) < 1024
    # f16 K and V: 2 bytes x 2 x n_layer(30) x n_embd_kv(192) x 512 cells, plus the float32 K
    # centres (30 x 192 x 4 bytes); llama.cpp reports the buffer in MiB with 2 decimals.
    assert abs(smol["kv_cache_bytes"] - (2 * 2 * 30 * 192 * 512 + 30 * 192 * 4)) <= 0.005 * 1024 * 1024
    assert smol["compute_bytes"] > 0
    assert smol["kv_type_k"] == "f16" and smol["n_ctx"] == 512
    assert models["broken"]["state"] == "failed" and models["broken"]["weights_bytes"] == 0
    # the server's own resident memory, split as the kernel counts it: SmolLM2's repacked or
    # anonymous copies, KV and compute buffers are anonymous; the file pages it still reads stay.
    # The KV cache is cleared at load, so all of it is resident; the compute buffer is not: most of
    # it is the logits of a whole 512-token batch (100 MB), whose pages only the rows written touch
    # (on the Zen 4 EPYC, with no repacked copies, 98 MB anonymous against 115 MB of both buffers)
    proc = body["process"]
    assert proc["source"] == "procfs" and proc["rss_bytes"] == proc["anonymous_bytes"] + proc["file_bytes"] + proc["shared_bytes"]
    assert proc["anonymous_bytes"] > smol["kv_cache_bytes"]
    # the weights are resident one way or the other: mapped file pages, or anonymous repacked copies
    assert proc["anonymous_bytes"] + proc["file_bytes"] > smol["weights_bytes"] + smol["kv_cache_bytes"]


def test_504_when_the_deadline_passes(server_factory):
    srv = server_factory(
        {"server": {"limits": {"request_timeout_s": 0.3}}, "models": [model_entry("smollm2-135m", SMOLLM2)]},
        "deadline",
    )
    t0 = time.monotonic()
    no_end = {"0": -100, "2": -100, "4": -100}  # no end token: a sampled answer cannot stop before the deadline
    r = post(srv, "/v1/completions", {"model": "smollm2-135m", "prompt": "Once upon a time", "max_tokens": 1000,
                                      "logit_bias": no_end}, key=None)
    assert r.status_code == 504
    assert envelope(r)["code"] == "deadline_exceeded"
    assert time.monotonic() - t0 < 5
    # A stream that already started reports the timeout in-band, then ends.
    with httpx.stream("POST", srv.base + "/v1/completions", timeout=30, json={
        "model": "smollm2-135m", "prompt": "Once upon a time", "max_tokens": 1000, "stream": True,
        "logit_bias": no_end}) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200
    assert '"deadline_exceeded"' in lines[-2] and lines[-1] == "data: [DONE]"
    # The Responses API: a 504 before the first token, a response.failed event after it.
    body = {"model": "smollm2-135m", "input": "Once upon a time", "logit_bias": no_end, "temperature": 1}
    r = post(srv, "/v1/responses", body, key=None)
    assert r.status_code == 504 and envelope(r)["code"] == "deadline_exceeded"
    with httpx.stream("POST", srv.base + "/v1/responses", timeout=30, json={**body, "stream": True}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert r.status_code == 200 and events[0]["type"] == "response.created"
    last = events[-1]
    assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
    assert last["response"]["error"]["code"] == "deadline_exceeded"
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    # In the background the POST answers at once, and the response is stored as failed.
    made = post(srv, "/v1/responses", {**body, "background": True}, key=None)
    assert made.status_code == 200 and made.json()["status"] == "queued", made.text
    done = wait_for(lambda: (got := httpx.get(f"{srv.base}/v1/responses/{made.json()['id']}").json())["status"]
                    not in ("queued", "in_progress") and got, timeout=10)
    assert done["status"] == "failed" and done["error"]["code"] == "deadline_exceeded", done
    # The Messages API: Anthropic's envelope before the first token, an error event after it.
    body = {"model": "smollm2-135m", "max_tokens": 1000, "messages": [{"role": "user", "content": "Once upon a time"}],
            "logit_bias": no_end}
    r = post(srv, "/v1/messages", body, key=None)
    assert r.status_code == 504 and r.json()["error"]["type"] == "timeout_error"
    with httpx.stream("POST", srv.base + "/v1/messages", timeout=30, json={**body, "stream": True}) as r:
        lines = list(r.iter_lines())
    assert r.status_code == 200 and lines[0] == "event: message_start"
    assert lines[-3] == "event: error" and json.loads(lines[-2][6:])["error"]["type"] == "timeout_error"
    # Ollama's API: {"error"} with the status before the first token, an {"error"} line after it.
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Once upon a time"}],
            "options": {"num_predict": 1000, "temperature": 1}, "logit_bias": no_end}
    r = post(srv, "/api/chat", {**body, "stream": False}, key=None)
    assert r.status_code == 504 and "error" in r.json()
    with httpx.stream("POST", srv.base + "/api/chat", timeout=30, json=body) as r:
        objects = [json.loads(line) for line in r.iter_lines() if line]
    assert r.status_code == 200 and objects[0]["done"] is False and set(objects[-1]) == {"error"}
    # The server is still fine afterwards.
    assert httpx.get(srv.base + "/health").status_code == 200


def test_400_for_bad_logprob_requests(strict_server):
    r = post(strict_server, "/v1/chat/completions", chat(top_logprobs=3))
    assert r.status_code == 400 and envelope(r)["param"] == "top_logprobs"
    r = post(strict_server, "/v1/chat/completions", chat(logprobs=True, top_logprobs=50))
    assert r.status_code == 400 and envelope(r)["param"] == "top_logprobs"
    r = post(strict_server, "/v1/completions", {"model": "smollm2-135m", "prompt": "Hi", "logprobs": 9})
    assert r.status_code == 400 and envelope(r)["param"] == "logprobs"


def test_an_allowed_browser_origin_gets_cors_headers_and_its_preflight_answered(strict_server):
    origin = {"Origin": "https://chat.example"}
    pre = httpx.options(strict_server.base + "/v1/chat/completions", headers={
        **origin, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"})
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == "https://chat.example"
    assert "POST" in pre.headers["access-control-allow-methods"]
    assert pre.headers["access-control-allow-headers"] == "authorization, content-type"
    ok = httpx.get(strict_server.base + "/v1/models", headers={**origin, "Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://chat.example"
    refused = httpx.get(strict_server.base + "/v1/models", headers=origin)  # a browser reads the 401 too
    assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == "https://chat.example"
    other = {"Origin": "https://elsewhere.example"}
    assert "access-control-allow-origin" not in httpx.get(strict_server.base + "/v1/models", headers={
        **other, "Authorization": f"Bearer {KEY}"}).headers
    pre = httpx.options(strict_server.base + "/v1/chat/completions", headers={
        **other, "Access-Control-Request-Method": "POST"})
    assert pre.status_code == 405 and "access-control-allow-origin" not in pre.headers
