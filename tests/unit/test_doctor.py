"""`eie doctor`: backends, the module chosen per device with its score, memory with its source,
CPU features and the KV types of this build, from a real process."""

from __future__ import annotations

import json
import subprocess

from conftest import EIE


def test_doctor_json_reports_the_build():
    out = subprocess.run([str(EIE), "doctor", "--json"], capture_output=True, text=True, timeout=120, check=True)
    r = json.loads(out.stdout)
    cpu = next(b for b in r["backends"] if b["name"] == "cpu")
    assert cpu["chosen"] and cpu["score"] > 0 and cpu["registered"] == "CPU"
    assert cpu["candidates"] and all("score" in c for c in cpu["candidates"])
    dev = next(d for d in r["devices"] if d["type"] == "cpu")
    assert dev["backend"] == "CPU" and dev["module"] and dev["score"] == cpu["score"]
    assert any(m["source"] == "psutil" and m["device"] == "cpu" for m in r["memory"])
    assert r["offload"] is None and r["compute_device"] == "cpu"
    assert {"f16", "q8_0", "q4_0", "turbo4", "turbo3", "turbo2"} <= set(r["kv_types"]) and r["turboquant"]
    assert "CPU" in r["features"]
    assert r["module_dirs"] and r["libggml"].split("/")[-1].startswith("libggml.so")


def test_doctor_text_has_every_section():
    out = subprocess.run([str(EIE), "doctor"], capture_output=True, text=True, timeout=120, check=True).stdout
    for section in ("backends:", "devices (ggml):", "memory:", "features:", "KV cache types:"):
        assert section in out, out
    assert "score" in out and "[source psutil]" in out and "turbo4" in out
