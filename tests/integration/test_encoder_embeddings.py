"""A sentence encoder (llama.cpp's `bert` architecture: no KV cache, no output layer, every token
an output) served through the real server as an embedding model, beside a generative one. The
model is a tiny random-weight BERT written by tests/tiny_bert.py (no BERT GGUF ships on PyPI);
its vectors are checked against llama-cpp-python's own embedding path on the same file."""

from __future__ import annotations

import concurrent.futures

import httpx
import llama_cpp
import numpy as np
import pytest

from appliance.engine import native
from conftest import SMOLLM2, model_entry
from tiny_bert import write_tiny_bert

TEXTS = ["The cat sat on the mat.", "Quarterly revenue grew five percent.", "Hi",
         "A much longer sentence about the weather in Oslo during the dark winter months of the year."]
N_CTX_TRAIN = 128


@pytest.fixture(scope="module")
def berts(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-bert")
    return {"mean": write_tiny_bert(d / "bert-mean.gguf", n_ctx_train=N_CTX_TRAIN, pooling=1),
            "cls": write_tiny_bert(d / "bert-cls.gguf", n_ctx_train=N_CTX_TRAIN, pooling=2, seed=1)}


@pytest.fixture(scope="module")
def server(server_factory, berts):
    return server_factory(
        {
            "models": [
                model_entry("smollm2-135m", SMOLLM2, n_parallel=1),
                model_entry("bert", berts["mean"], n_ctx=256, n_parallel=4, n_batch=256, embedding=True),
                model_entry("bert-cls", berts["cls"], n_ctx=256, n_parallel=2, n_batch=64, embedding=True),
                model_entry("bert-cls-as-mean", berts["cls"], n_ctx=256, n_parallel=2, n_batch=64, embedding=True,
                            pooling="mean"),
                model_entry("bert-generative", berts["mean"], n_ctx=256, n_parallel=1),
            ],
        },
        "encoder-embeddings",
    )


def vectors(server, model: str, inp) -> np.ndarray:
    r = httpx.post(server.base + "/v1/embeddings", json={"model": model, "input": inp}, timeout=60)
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]])


def reference(path, texts: list[str], pooling: int) -> np.ndarray:
    native.init_backend()
    model = llama_cpp.Llama(str(path), embedding=True, pooling_type=pooling, n_ctx=N_CTX_TRAIN,
                            n_batch=N_CTX_TRAIN, n_threads=2, verbose=False)
    try:
        ref = np.array(model.embed(texts, normalize=False), dtype=np.float64)
    finally:
        model.close()
    return ref / np.linalg.norm(ref, axis=1, keepdims=True)


@pytest.mark.parametrize("model, gguf, pooling", [
    ("bert", "mean", llama_cpp.LLAMA_POOLING_TYPE_MEAN),  # auto: the GGUF's own pooling type
    ("bert-cls", "cls", llama_cpp.LLAMA_POOLING_TYPE_CLS),
    ("bert-cls-as-mean", "cls", llama_cpp.LLAMA_POOLING_TYPE_MEAN),  # models[].pooling overrides it
])
def test_encoder_vectors_are_llama_cpps_and_batched_as_alone(server, berts, model, gguf, pooling):
    batch = vectors(server, model, TEXTS)
    assert batch.shape == (len(TEXTS), 64)
    assert np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    assert ((batch * reference(berts[gguf], TEXTS, pooling)).sum(axis=1) > 1 - 1e-5).all()
    alone = np.array([vectors(server, model, t)[0] for t in TEXTS])
    assert ((batch * alone).sum(axis=1) > 1 - 1e-5).all()
    assert (batch @ batch.T)[np.triu_indices(len(TEXTS), 1)].max() < 0.999  # different texts, different vectors


def test_cls_and_mean_pooling_of_one_file_differ(server):
    cls, mean = vectors(server, "bert-cls", TEXTS), vectors(server, "bert-cls-as-mean", TEXTS)
    assert ((cls * mean).sum(axis=1) < 0.99).all()


def test_an_encoder_takes_no_kv_cache(server):
    status = httpx.get(server.base + "/v1/admin/vram/status").json()
    bert = next(m for m in status["models"] if m["name"] == "bert")
    assert bert["state"] == "ready"
    assert bert["kv_cache_bytes"] == 0 and bert["estimate"]["kv_cache_bytes"] == 0
    assert not bert["k_centered"]  # nothing to centre
    assert 0 < bert["compute_bytes"] <= bert["estimate"]["compute_bytes"]


def test_an_input_past_the_training_context_is_refused_and_the_server_goes_on(server):
    """The encoder's learned positions end at its training context (128 here, n_batch 256):
    llama.cpp would abort the process on a longer input."""
    r = httpx.post(server.base + "/v1/embeddings", json={"model": "bert", "input": ["fine", "cat " * 200]})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "input[1]" and err["code"] == "context_length_exceeded"
    assert "at most 128 (the model's training context)" in err["message"]
    longest = vectors(server, "bert", ["cat " * (N_CTX_TRAIN - 2)])  # [CLS] and [SEP] fill the rest
    assert longest.shape == (1, 64)


def test_an_encoder_configured_to_generate_fails_its_load_with_the_fix_named(server):
    health = httpx.get(server.base + "/health").json()
    model = health["models"]["bert-generative"]
    assert model["state"] == "failed"
    assert "sentence encoder" in model["error"] and "models[].embedding: true" in model["error"]
    assert health["models"]["bert"]["state"] == "ready"


def test_encoders_and_generation_at_once(server):
    many = [f"the model server cache {i}" for i in range(30)]

    def chat() -> str:
        r = httpx.post(server.base + "/v1/chat/completions", timeout=120, json={
            "model": "smollm2-135m", "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 8, "temperature": 0})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        jobs = [pool.submit(vectors, server, "bert", many) for _ in range(3)] + [pool.submit(chat)]
        results = [j.result() for j in jobs]
    assert all(np.array_equal(results[0], r) for r in results[1:3])  # the same packing, the same bits
    assert results[3].strip()
