"""Every preset boots with the models setup installs and serves each of its models and groups."""

from __future__ import annotations

import httpx
import pytest
import yaml

from conftest import ROOT

PRESETS = sorted((ROOT / "presets").glob("*.yaml"))


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: p.name)
def test_preset_boots_and_serves(server_factory, preset):
    config = yaml.safe_load(preset.read_text())
    config["model_dir"] = str((preset.parent / config.get("model_dir", ".")).resolve())
    srv = server_factory(config, preset.stem)
    assert httpx.get(srv.base + "/health").status_code == 200
    if config.get("inference", {}).get("kv_cache", {}).get("prefix", {}).get("warm"):
        # warm prefixes are prefilled in the background after each load
        import time

        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            kv = httpx.get(srv.base + "/v1/admin/kv/status").json()["models"]
            if all(m["ram"]["entries"] >= 1 for m in kv.values()):
                break
            time.sleep(0.2)
        assert all(m["ram"]["entries"] >= 1 for m in kv.values()), kv
    for m in config["models"]:
        r = httpx.post(srv.base + "/v1/completions", timeout=120,
                       json={"model": m["name"], "prompt": "Hello", "max_tokens": 2})
        assert r.status_code == 200, (m["name"], r.text)
    for g in config.get("groups", []):
        path = "/v1/chain/execute" if g.get("type") == "sequential" else "/v1/batch/execute"
        r = httpx.post(srv.base + path, timeout=120, json={
            "group": g["name"], "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert r.status_code == 200, (g["name"], r.text)
        assert r.json()["complete"] is True
