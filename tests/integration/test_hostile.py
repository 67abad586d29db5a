"""Hostile input: a corpus of malformed requests, each answered with the right 4xx naming the
field; and schemathesis, generating requests from /openapi.json, finding no 5xx."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from conftest import MODELS, SMOLLM2, model_entry

KEY, ADMIN = "hostile-user-key", "hostile-admin-key"
MSG = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def hostile(server_factory):
    return server_factory({
        "model_dir": str(MODELS),
        "server": {"api_keys": [KEY], "admin_keys": [ADMIN],
                   "limits": {"max_tokens": 2, "max_body_bytes": 1 << 20, "request_timeout_s": 30}},
        "models": [model_entry("a", SMOLLM2.name, n_ctx=512, threads=1, n_parallel=4)],
        "groups": [{"name": "g", "models": ["a"]}, {"name": "c", "models": ["a", "a"], "type": "sequential"}],
    }, "hostile")


def post(srv, path: str, body, key: str = KEY) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(srv.base + path, content=content, timeout=60,
                      headers={"Authorization": f"Bearer {key}", "content-type": "application/json"})


def chat(**kw) -> dict:
    return {"model": "a", "messages": MSG, "max_tokens": 2, **kw}


DEEP = (b'{"model":"a","messages":[{"role":"user","content":"x"}],"response_format":{"type":"json_schema",'
        b'"json_schema":{"schema":' + b"[" * 200_000 + b"]" * 200_000 + b"}}}")  # an untyped field
# Nested schemas a JSON parser takes, past what the grammar converter recurses into.
DEEP_SCHEMA = json.dumps({"model": "a", "messages": [{"role": "user", "content": "x"}],
                          "response_format": {"type": "json_object", "schema": json.loads(
                              '{"type": "array", "items": ' * 900 + "{}" + "}" * 900)}}).encode()
CORPUS = [
    # (name, path, body, status, param, code)
    ("invalid json", "/v1/chat/completions", b'{"model": "a", "messages": [', 400, None, "invalid_json"),
    ("not an object", "/v1/chat/completions", b"[1, 2, 3]", 400, None, "invalid_value"),
    ("empty body", "/v1/completions", b"", 400, None, "invalid_json"),
    ("wrong type max_tokens", "/v1/chat/completions", chat(max_tokens="ten"), 400, "max_tokens", "invalid_value"),
    ("wrong type messages", "/v1/chat/completions", chat(messages="hello"), 400, "messages", "invalid_value"),
    ("wrong type stream", "/v1/chat/completions", chat(stream="yes"), 400, "stream", "invalid_value"),
    ("wrong type content", "/v1/chat/completions", chat(messages=[{"role": "user", "content": 5}]), 400,
     "messages[0].content", "invalid_value"),
    ("huge max_tokens", "/v1/chat/completions", chat(max_tokens=10**30), 400, "max_tokens", "invalid_value"),
    ("huge seed", "/v1/chat/completions", chat(seed=10**40), 400, "seed", "invalid_value"),
    ("huge n", "/v1/completions", {"model": "a", "prompt": "x", "n": 10**12}, 400, "n", "invalid_value"),
    ("overflowing float", "/v1/chat/completions",
     b'{"model":"a","messages":[{"role":"user","content":"x"}],"temperature":1e999}', 400, "temperature",
     "invalid_value"),
    ("token id out of vocab", "/v1/completions", {"model": "a", "prompt": [10**9]}, 400, "prompt", None),
    ("negative max_tokens", "/v1/chat/completions", chat(max_tokens=-1), 400, "max_tokens", "invalid_value"),
    ("max_tokens over the limit", "/v1/chat/completions", chat(max_tokens=3), 400, "max_tokens", None),
    ("negative top_logprobs", "/v1/chat/completions", chat(logprobs=True, top_logprobs=-3), 400, "top_logprobs",
     "invalid_value"),
    ("invalid utf-8", "/v1/chat/completions",
     b'{"model":"a","messages":[{"role":"user","content":"\xff\xfe\xc3"}]}', 400, None, "invalid_json"),
    ("10 MB string", "/v1/chat/completions",
     json.dumps(chat(messages=[{"role": "user", "content": "x" * 10_000_000}])).encode(), 413, None,
     "request_too_large"),
    ("deeply nested json", "/v1/chat/completions", DEEP, 400, None, "invalid_json"),
    ("deeply nested schema", "/v1/chat/completions", DEEP_SCHEMA, 400, "response_format.schema", None),
    ("deeply nested messages", "/v1/chat/completions",
     b'{"model":"a","messages":' + b"[" * 50_000 + b"]" * 50_000 + b"}", 400, "messages[0]", "invalid_value"),
    ("unknown role", "/v1/chat/completions", chat(messages=[{"role": "wizard", "content": "x"}]), 400,
     "messages[0].role", "invalid_value"),
    ("empty messages", "/v1/chat/completions", chat(messages=[]), 400, "messages", "invalid_value"),
    ("missing messages", "/v1/chat/completions", {"model": "a"}, 400, "messages", "invalid_value"),
    ("empty message content", "/v1/chat/completions", chat(messages=[{"role": "user", "content": ""}]), None,
     None, None),
    ("empty prompt list", "/v1/completions", {"model": "a", "prompt": []}, 400, "prompt", None),
    ("null model", "/v1/chat/completions", chat(model=None), 400, "model", "invalid_value"),
    ("group: unknown role", "/v1/batch/execute", {"group": "g", "messages": [{"role": "x", "content": "y"}]}, 400,
     "messages[0].role", "invalid_value"),
    ("group: negative max_tokens", "/v1/batch/execute", {"group": "g", "messages": MSG, "max_tokens": -5}, 400,
     "max_tokens", "invalid_value"),
    ("admin: path traversal in model", "/v1/admin/models/load", {"model": "../../../etc/passwd"}, 404, "model",
     "model_not_found"),
    ("admin: kv convert unknown type", "/v1/admin/kv/convert", {"model": "a", "mode": "q1_0"}, 400, "mode",
     "invalid_value"),
    ("admin: warm traversal", "/v1/admin/kv/warm", {"model": "../a", "prompt": "x"}, 404, "model", "model_not_found"),
]


@pytest.mark.parametrize("name,path,body,status,param,code", CORPUS, ids=[c[0] for c in CORPUS])
def test_malformed_request_gets_the_right_4xx(hostile, name, path, body, status, param, code):
    key = ADMIN if path.startswith("/v1/admin/") else KEY
    r = post(hostile, path, body, key)
    if status is None:  # accepted as a valid (if odd) request: any answer but a 5xx
        assert r.status_code < 500, r.text
        return
    assert r.status_code == status, (name, r.status_code, r.text[:300])
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param, (name, err)
    if code is not None:
        assert err["code"] == code, (name, err)
    assert httpx.get(hostile.base + "/health").status_code == 200  # still up


@pytest.mark.parametrize("sub", ["..", "../..", "/etc", "a/../../..", "%2e%2e"])
def test_path_traversal_in_admin_model_paths(hostile, sub):
    r = httpx.get(hostile.base + "/v1/admin/models/discover", params={"path": sub},
                  headers={"Authorization": f"Bearer {ADMIN}"})
    assert r.status_code in (400, 404), r.text
    err = r.json()["error"]
    assert err["param"] == "path"
    if sub != "%2e%2e":
        assert err["code"] == "path_outside_model_dir"


def test_plugin_path_outside_the_plugin_dir_is_refused(server_factory, tmp_path):
    srv = server_factory({"models": [model_entry("a", SMOLLM2, n_ctx=512, threads=1)],
                          "policy": {"plugin_dir": str(tmp_path / "plugins")}}, "plugin-dir")
    (tmp_path / "plugins").mkdir()
    (tmp_path / "plugins" / "escape.so").symlink_to("/usr/lib/x86_64-linux-gnu/libc.so.6")
    for strategy in ("plugin:/tmp/evil.so", f"plugin:{tmp_path}/plugins/../evil.so",
                     f"plugin:{tmp_path}/plugins/escape.so"):
        config = yaml.safe_load(srv.config_path.read_text())
        config["policy"]["strategy"] = strategy
        srv.config_path.write_text(yaml.safe_dump(config))
        r = httpx.post(srv.base + "/v1/admin/config/reload")
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "invalid_config" and "policy.strategy" in err["message"]
        assert "outside policy.plugin_dir" in err["message"]
    assert httpx.get(srv.base + "/health").json()["strategy"] == "fixed-appliance"  # unchanged


def test_schemathesis_finds_no_server_error(hostile, tmp_path):
    """Requests generated from /openapi.json (a fixed, small number per operation, so it stays
    bounded): none may get a 5xx, and the server stays up."""
    cmd = [str(Path(sys.executable).parent / "schemathesis"), "run", hostile.base + "/openapi.json",
           "--checks", "not_a_server_error", "--max-examples", "12", "--seed", "1",
           "--header", f"Authorization: Bearer {ADMIN}", "--request-timeout", "60",
           "--phases", "examples,coverage,fuzzing", "--no-color"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=420, cwd=tmp_path)
    tail = (out.stdout + out.stderr)[-6000:]
    print(tail)
    assert out.returncode == 0, tail
    assert " passed" in tail and "failed" not in tail.split("Seed:")[0].split("===")[-1]
    assert httpx.get(hostile.base + "/health").status_code == 200
