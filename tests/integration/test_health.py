"""/health during boot and under load."""

from __future__ import annotations

import threading
import time

import httpx

from conftest import GEMMA3, SMOLLM2, model_entry


def test_health_is_503_loading_until_the_fixed_set_is_ready(server_factory, tmp_path):
    srv = server_factory(  # a cache dir of its own: a first boot, which measures K means
        {"server": {"cache_dir": str(tmp_path / "cache")},
         "models": [model_entry("smollm2-135m", SMOLLM2), model_entry("gemma3-270m", GEMMA3, n_ctx=8192)]},
        "boot", wait=False,
    )
    seen: list[tuple[int, str, dict]] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            r = httpx.get(srv.base + "/health", timeout=2)
        except httpx.TransportError:
            time.sleep(0.01)
            continue
        body = r.json()
        seen.append((r.status_code, body["status"], body["models"]))
        if body["status"] != "loading":
            break
    assert seen[-1][:2] == (200, "ok")
    loading = [s for s in seen if s[1] == "loading"]
    assert loading, "never saw the loading state"
    assert all(code == 503 for code, _, _ in loading)
    assert any(models["gemma3-270m"]["state"] == "loading" for _, _, models in loading)
    r = httpx.post(srv.base + "/v1/completions", json={"model": "gemma3-270m", "prompt": "Hi", "max_tokens": 2})
    assert r.status_code == 200


def test_health_answers_fast_while_models_decode(main_server):
    stop = threading.Event()

    def load(model: str) -> None:
        with httpx.Client(timeout=120) as c:
            while not stop.is_set():
                c.post(main_server.base + "/v1/completions",
                       json={"model": model, "prompt": "Once upon a time", "max_tokens": 64})

    workers = [threading.Thread(target=load, args=(m,)) for m in ("smollm2-135m", "smollm2-135m", "gemma3-270m")]
    for w in workers:
        w.start()
    time.sleep(1.0)
    latencies = []
    with httpx.Client() as c:
        for _ in range(30):
            t0 = time.perf_counter()
            assert c.get(main_server.base + "/health").status_code == 200
            latencies.append(time.perf_counter() - t0)
            time.sleep(0.05)
    stop.set()
    for w in workers:
        w.join()
    latencies.sort()
    # Generous bounds for a loaded 2-core machine; an event loop blocked by decoding would take seconds.
    assert latencies[len(latencies) // 2] < 0.05, latencies
    assert latencies[-1] < 0.5, latencies
