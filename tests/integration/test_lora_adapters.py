"""LoRA adapters served beside their model on one context (engine/adapters.py): a tiny
random-weight llama with a random adapter, checked against the same weights with the adapter
merged in, through the real server; concurrency and the prefix cache across adapter sets."""

from __future__ import annotations

import concurrent.futures
import os

import httpx
import pytest

from conftest import model_entry
from lora_adapter import write_lora
from tiny_llama import write_tiny_llama

PROMPTS = ["the cat sat on the mat and", "hello world the dog", "a cat of the world is"]


@pytest.fixture(scope="module")
def tiny_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora")
    base = write_tiny_llama(d / "base.gguf", n_layer=2)
    deltas = write_lora(base, d / "adapter.gguf")
    write_lora(base, d / "activated.gguf", invocation_tokens=[260, 261])
    merged = write_tiny_llama(d / "merged.gguf", n_layer=2, deltas=deltas)
    half = write_tiny_llama(d / "half.gguf", n_layer=2, deltas={k: 0.5 * v for k, v in deltas.items()})
    return d, base, merged, half


@pytest.fixture(scope="module")
def lora_server(server_factory, tiny_files):
    d, base, merged, half = tiny_files
    threads = min(os.cpu_count() or 2, 2)
    return server_factory({"models": [
        model_entry("tiny", base, n_ctx=512, n_parallel=4, threads=threads,
                    kv_cache={"prefix": {"block_tokens": 4}},
                    lora=[{"name": "tiny-lora", "path": str(d / "adapter.gguf")},
                          {"name": "tiny-half", "path": str(d / "adapter.gguf"), "scale": 0.5}]),
        model_entry("merged", merged, n_ctx=512, n_parallel=1, threads=threads),
        model_entry("half", half, n_ctx=512, n_parallel=1, threads=threads),
        model_entry("activated", base, n_ctx=512, n_parallel=1, threads=threads,
                    lora=[{"name": "activated-lora", "path": str(d / "activated.gguf")}]),
    ]}, "lora")


def complete(srv, model: str, prompt: str, n: int = 12, **kw) -> dict:
    r = httpx.post(srv.base + "/v1/completions", timeout=120, json={
        "model": model, "prompt": prompt, "max_tokens": n, "temperature": 0, "logprobs": 1, **kw})
    assert r.status_code == 200, r.text
    return r.json()


def tokens_and_logprobs(body: dict) -> tuple[list[str], list[float]]:
    lp = body["choices"][0]["logprobs"]
    return lp["tokens"], lp["token_logprobs"]


def test_adapter_answers_as_the_merged_weights(lora_server):
    for adapter, merged in (("tiny-lora", "merged"), ("tiny-half", "half")):
        for prompt in PROMPTS:
            a_tokens, a_lp = tokens_and_logprobs(complete(lora_server, adapter, prompt))
            m_tokens, m_lp = tokens_and_logprobs(complete(lora_server, merged, prompt))
            assert a_tokens == m_tokens, (adapter, prompt)
            assert max(abs(x - y) for x, y in zip(a_lp, m_lp)) < 2e-3, (adapter, prompt, a_lp, m_lp)


def test_base_and_adapters_differ(lora_server):
    """Far more than the merged comparison's tolerance: a request never gets another set's answer."""
    for prompt in PROMPTS:
        answers = {m: tokens_and_logprobs(complete(lora_server, m, prompt)) for m in ("tiny", "tiny-lora", "tiny-half")}
        for a, b in (("tiny", "tiny-lora"), ("tiny", "tiny-half"), ("tiny-lora", "tiny-half")):
            (ta, la), (tb, lb) = answers[a], answers[b]
            assert ta != tb or max(abs(x - y) for x, y in zip(la, lb)) > 0.05, (a, b, prompt)


def test_concurrent_sets_answer_as_alone(lora_server):
    """Sequences of three adapter sets at once (one decode per set and step) give exactly the
    tokens and log-probabilities each gives alone. This f32 model needs patch 0018: before it,
    a one-row product summed in another order than two rows, and log-probabilities moved in the
    5th decimal beside other sequences, with adapters or without."""
    jobs = [(m, p) for m in ("tiny", "tiny-lora", "tiny-half") for p in PROMPTS]
    alone = {job: tokens_and_logprobs(complete(lora_server, *job, n=24)) for job in jobs}
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        together = dict(zip(jobs, pool.map(lambda job: tokens_and_logprobs(complete(lora_server, *job, n=24)), jobs)))
    assert together == alone


def test_prefix_cache_keeps_sets_apart(lora_server):
    """A prefix saved by one adapter set never restores into another: each set's first request
    computes its prompt, its second restores it, and the restored answer is the cold one."""
    prompt = " ".join(f"w{i}" for i in range(280, 296))  # words no other test prompt has
    cold = {}
    for model in ("tiny", "tiny-lora", "tiny-half"):
        first = complete(lora_server, model, prompt, n=8)
        # every prompt of this byte-level vocabulary begins with the block <s> + the 3 bytes of "▁",
        # which each set has saved before; the base's whole 113-token prompt is saved before the adapters ask
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] <= 4, model
        cold[model] = tokens_and_logprobs(first)
    for model in ("tiny", "tiny-lora", "tiny-half"):
        again = complete(lora_server, model, prompt, n=8)
        assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= 100, model
        tokens, logprobs = tokens_and_logprobs(again)
        assert tokens == cold[model][0]
        assert max(abs(x - y) for x, y in zip(logprobs, cold[model][1])) < 1e-3


def test_adapters_listed_with_their_model(lora_server):
    cards = {c["id"]: c for c in httpx.get(lora_server.base + "/v1/models").json()["data"]}
    assert cards["tiny-lora"]["adapter_of"] == "tiny" and cards["tiny-half"]["adapter_of"] == "tiny"
    assert cards["tiny"].get("adapter_of") is None and cards["tiny-lora"]["state"] == "ready"
    one = httpx.get(lora_server.base + "/v1/models/tiny-half").json()
    assert one["id"] == "tiny-half" and one["adapter_of"] == "tiny"
    status = httpx.get(lora_server.base + "/v1/admin/vram/status").json()
    tiny = next(m for m in status["models"] if m["name"] == "tiny")
    assert tiny["lora_adapter_bytes"] > 0 and tiny["estimate"]["lora_adapter_bytes"] > 0
    assert tiny["total_bytes"] >= tiny["weights_bytes"] + tiny["lora_adapter_bytes"]


def test_llama_server_per_request_lora(lora_server):
    """llama-server's `lora: [{id, scale}]` picks the model's adapters by index, in place of the
    set the model name gives; /lora-adapters lists them."""
    prompt = PROMPTS[0]
    by_name = {m: tokens_and_logprobs(complete(lora_server, m, prompt)) for m in ("tiny", "tiny-lora", "tiny-half")}
    assert tokens_and_logprobs(complete(lora_server, "tiny", prompt, lora=[{"id": 0, "scale": 1.0}])) == by_name["tiny-lora"]
    assert tokens_and_logprobs(complete(lora_server, "tiny", prompt, lora=[{"id": 1, "scale": 0.5}])) == by_name["tiny-half"]
    assert tokens_and_logprobs(complete(lora_server, "tiny-lora", prompt, lora=[])) == by_name["tiny"]
    assert tokens_and_logprobs(complete(lora_server, "tiny-lora", prompt, lora=[{"id": 0, "scale": 0}])) == by_name["tiny"]
    native = httpx.post(lora_server.base + "/completion", timeout=60, json={
        "model": "tiny", "prompt": prompt, "n_predict": 12, "temperature": 0, "lora": [{"id": 0, "scale": 1}]})
    assert native.status_code == 200
    assert native.json()["content"] == complete(lora_server, "tiny-lora", prompt)["choices"][0]["text"]
    for body, param in (({"lora": [{"id": 2, "scale": 1}]}, "lora[0].id"),
                        ({"lora": [{"id": 0, "scale": 1}, {"id": 0, "scale": 2}]}, "lora[1].id"),
                        ({"lora": [{"id": 0, "scale": 99}]}, "lora[0].scale")):
        r = httpx.post(lora_server.base + "/v1/completions", timeout=60,
                       json={"model": "tiny", "prompt": prompt, "max_tokens": 2, **body})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.post(lora_server.base + "/v1/completions", timeout=60,
                   json={"model": "merged", "prompt": prompt, "max_tokens": 2, "lora": [{"id": 0, "scale": 1}]})
    assert r.status_code == 400 and "has no adapter 0 (it has none" in r.json()["error"]["message"]
    # each adapter at the scale the name serves it at
    listed = httpx.get(lora_server.base + "/lora-adapters", params={"model": "tiny-half"}).json()
    assert [(a["id"], a["name"], a["scale"]) for a in listed] == [(0, "tiny-lora", 0.0), (1, "tiny-half", 0.5)]
    assert listed[0]["path"].endswith("adapter.gguf")
    listed = httpx.get(lora_server.base + "/lora-adapters", params={"model": "tiny"}).json()
    assert [a["scale"] for a in listed] == [0.0, 0.0]
    assert httpx.get(lora_server.base + "/lora-adapters", params={"model": "nope"}).status_code == 404


def set_lora(srv, model: str, body) -> httpx.Response:
    return httpx.post(srv.base + "/lora-adapters", params={"model": model}, json=body)


def test_llama_server_global_adapter_scales(lora_server):
    """POST /lora-adapters: the list becomes the set the name serves (llama-server's global
    scales, what a request without its own `lora` gets), the others off."""
    prompt = PROMPTS[1]
    by_name = {m: tokens_and_logprobs(complete(lora_server, m, prompt)) for m in ("tiny", "tiny-lora", "tiny-half")}
    try:
        r = set_lora(lora_server, "tiny", [{"id": 1, "scale": 0.5}])
        assert r.status_code == 200 and r.json()["success"] is True, r.text
        assert [a["scale"] for a in r.json()["adapters"]] == [0.0, 0.5]
        assert tokens_and_logprobs(complete(lora_server, "tiny", prompt)) == by_name["tiny-half"]
        assert [a["scale"] for a in httpx.get(lora_server.base + "/lora-adapters", params={"model": "tiny"}).json()] \
            == [0.0, 0.5]
        # a request's own list still replaces the name's set
        assert tokens_and_logprobs(complete(lora_server, "tiny", prompt, lora=[])) == by_name["tiny"]
        # an adapter's name: its set off, then another adapter in its place
        assert set_lora(lora_server, "tiny-lora", []).status_code == 200
        assert tokens_and_logprobs(complete(lora_server, "tiny-lora", prompt)) == by_name["tiny"]
        assert set_lora(lora_server, "tiny-lora", [{"id": 0, "scale": 0.5}]).status_code == 200
        assert tokens_and_logprobs(complete(lora_server, "tiny-lora", prompt)) == by_name["tiny-half"]
        for body, param in (([{"id": 2, "scale": 1}], "[0].id"), ([{"id": 0, "scale": 1}, {"id": 0, "scale": 2}], "[1].id"),
                            ([{"id": 0, "scale": 99}], "[0].scale"), ({"id": 0}, None)):
            r = set_lora(lora_server, "tiny", body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
        assert set_lora(lora_server, "merged", [{"id": 0, "scale": 1}]).json()["error"]["param"] == "[0].id"
        assert set_lora(lora_server, "nope", []).status_code == 404
        assert httpx.post(lora_server.base + "/lora-adapters", json=[]).json()["error"]["param"] == "model"
    finally:
        set_lora(lora_server, "tiny", [])
        set_lora(lora_server, "tiny-lora", [{"id": 0, "scale": 1}])
    assert tokens_and_logprobs(complete(lora_server, "tiny", prompt)) == by_name["tiny"]
    assert tokens_and_logprobs(complete(lora_server, "tiny-lora", prompt)) == by_name["tiny-lora"]


def test_activated_lora_is_refused_by_name(lora_server):
    """An aLoRA applies from its invocation tokens on (llama-server finds them in the prompt);
    applied to every token it would answer as it was not trained to: the load fails instead."""
    model = httpx.get(lora_server.base + "/health").json()["models"]["activated"]
    assert model["state"] == "failed"
    assert "'activated-lora'" in model["error"] and "activated LoRA" in model["error"]


def test_kv_warm_for_an_adapter_saves_its_own_prefix(lora_server):
    prompt = " ".join(f"w{i}" for i in range(200, 216))
    r = httpx.post(lora_server.base + "/v1/admin/kv/warm", timeout=60, json={"model": "tiny-half", "prompt": prompt})
    assert r.status_code == 200 and r.json()["model"] == "tiny-half", r.text
    adapter = complete(lora_server, "tiny-half", prompt, n=4)
    assert adapter["usage"]["prompt_tokens_details"]["cached_tokens"] >= 100
    assert complete(lora_server, "tiny", prompt, n=4)["usage"]["prompt_tokens_details"]["cached_tokens"] <= 4
