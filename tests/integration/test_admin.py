"""Admin endpoints: admin keys, model discovery inside model_dir, config reload."""

from __future__ import annotations

import time

import httpx
import pytest
import yaml

from conftest import MODELS, SMOLLM2, model_entry

USER, ADMIN = "user-key-00000000", "admin-key-0000000"


def small(name: str) -> dict:
    return model_entry(name, SMOLLM2.name, n_ctx=512, n_parallel=1, n_batch=64)


@pytest.fixture(scope="module")
def admin_server(server_factory):
    return server_factory({
        "model_dir": str(MODELS),
        "server": {"api_keys": [USER], "admin_keys": [ADMIN], "limits": {"max_tokens": 64}},
        "models": [small("a")],
    }, "admin")


def get(srv, path: str, key: str | None) -> httpx.Response:
    return httpx.get(srv.base + path, headers={"Authorization": f"Bearer {key}"} if key else {})


def post(srv, path: str, key: str | None, body: dict | None = None) -> httpx.Response:
    return httpx.post(srv.base + path, json=body or {}, timeout=60,
                      headers={"Authorization": f"Bearer {key}"} if key else {})


@pytest.mark.parametrize("path", ["/v1/admin/vram/status", "/v1/admin/scheduling/status", "/v1/admin/models/discover"])
def test_admin_endpoints_need_an_admin_key(admin_server, path):
    assert get(admin_server, path, None).status_code == 401
    r = get(admin_server, path, USER)
    assert r.status_code == 403 and r.json()["error"]["code"] == "admin_key_required"
    assert get(admin_server, path, ADMIN).status_code == 200
    for action in ("load", "unload"):
        assert post(admin_server, f"/v1/admin/models/{action}", USER, {"model": "a"}).status_code == 403
    assert post(admin_server, "/v1/admin/config/reload", USER).status_code == 403


def test_discover_lists_gguf_files_only_inside_model_dir(admin_server):
    body = get(admin_server, "/v1/admin/models/discover", ADMIN).json()
    found = {m["path"]: m for m in body["models"]}
    assert set(found) >= {"SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"}
    assert found["SmolLM2-135M-Instruct.Q4_1.gguf"]["configured_as"] == "a"
    assert found["SmolLM2-135M-Instruct.Q4_1.gguf"]["configured_names"] == ["a"]
    assert found["gemma-3-270m-q4_k_m.gguf"]["architecture"] == "gemma3"
    for bad in ("..", "../..", "/etc", "../models/../.."):
        r = get(admin_server, f"/v1/admin/models/discover?path={bad}", ADMIN)
        assert r.status_code == 400 and r.json()["error"]["code"] == "path_outside_model_dir", bad
    for bad in ("%00", "a" * 300):  # (500s: an embedded NUL, a name too long for the file system)
        r = get(admin_server, f"/v1/admin/models/discover?path={bad}", ADMIN)
        assert r.status_code == 400 and r.json()["error"]["param"] == "path", r.text


def test_config_reload_applies_live_changes_and_keeps_the_old_config_on_error(server_factory):
    srv = server_factory({"model_dir": str(MODELS), "server": {"limits": {"max_tokens": 64}},
                          "models": [small("a")]}, "reload")
    assert post(srv, "/v1/completions", None, {"model": "a", "prompt": "Hi", "max_tokens": 50}).status_code == 200
    cfg = yaml.safe_load(srv.config_path.read_text())
    cfg["server"]["limits"]["max_tokens"] = 8
    cfg["server"]["stream_keepalive_s"] = 30
    cfg["inference"] = {"kv_adaptive": {"cooldown_s": 5}}
    cfg["server"]["port"] = cfg["server"]["port"] + 1
    cfg["models"].append(small("b"))
    cfg["groups"] = [{"name": "pair", "models": ["a", "b"]}]
    srv.config_path.write_text(yaml.safe_dump(cfg))
    r = post(srv, "/v1/admin/config/reload", None)
    assert r.status_code == 200, r.text
    body = r.json()
    assert "server.limits" in body["applied"] and "models.b (added)" in body["applied"] and "groups" in body["applied"]
    assert "server.stream_keepalive_s" in body["applied"] and "inference.kv_adaptive" in body["applied"]
    assert body["restart_required"] == ["server.port"]
    r = post(srv, "/v1/completions", None, {"model": "a", "prompt": "Hi", "max_tokens": 50})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = post(srv, "/completion", None, {"model": "a", "prompt": "Hi", "n_predict": 50})  # llama-server's too
    assert r.status_code == 400 and r.json()["error"]["param"] == "n_predict", r.text
    deadline = time.monotonic() + 60
    while httpx.get(srv.base + "/health").json()["models"]["b"]["state"] != "ready" and time.monotonic() < deadline:
        time.sleep(0.1)
    r = post(srv, "/v1/batch/execute", None, {"group": "pair", "messages": [{"role": "user", "content": "Hi"}],
                                                "max_tokens": 4})
    assert r.status_code == 200 and r.json()["complete"] is True

    srv.config_path.write_text("models: [{name: a, path: x.gguf, n_ctx: tiny}]\n")
    r = post(srv, "/v1/admin/config/reload", None)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "invalid_config" and "models[0].n_ctx" in err["message"]
    r = post(srv, "/v1/completions", None, {"model": "b", "prompt": "Hi", "max_tokens": 8})
    assert r.status_code == 200  # still running on the last good config


def test_overlapping_reloads_add_a_model_once_and_a_newly_pinned_one_loads(server_factory):
    # two reloads both planned against the old config: each added the model, one loaded copy was
    # orphaned (its memory uncounted) and the tracked one stayed unloaded, /health degraded; and
    # a reload that pinned a configured, unloaded model left it unloaded
    import asyncio

    srv = server_factory({"model_dir": str(MODELS), "policy": {"strategy": "pinned-group"},
                          "models": [small("a"), small("c")], "groups": [{"name": "core", "models": ["a"],
                                                                          "pinned": True}]}, "reload-race")
    assert httpx.get(srv.base + "/health").json()["models"]["c"]["state"] == "unloaded"
    cfg = yaml.safe_load(srv.config_path.read_text())
    cfg["models"].append(small("d"))
    cfg["groups"] = [{"name": "core", "models": ["a", "c", "d"], "pinned": True}]
    srv.config_path.write_text(yaml.safe_dump(cfg))

    async def reloads() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=120) as c:
            return await asyncio.gather(*[c.post(srv.base + "/v1/admin/config/reload") for _ in range(6)])

    answers = asyncio.run(reloads())
    assert all(r.status_code == 200 for r in answers)
    assert sum("models.d (added)" in r.json()["applied"] for r in answers) == 1
    deadline = time.monotonic() + 60
    while httpx.get(srv.base + "/health").status_code != 200 and time.monotonic() < deadline:
        time.sleep(0.2)
    health = httpx.get(srv.base + "/health").json()
    assert health["status"] == "ok" and {m["state"] for m in health["models"].values()} == {"ready"}, health
    loads = [e for e in httpx.get(srv.base + "/v1/admin/scheduling/status").json()["events"]
             if e["event"] == "load" and e["model"] == "d"]
    assert len(loads) == 1, loads
    srv.stop()
