"""POST /v1/embeddings through the real server: SmolLM2 configured as an embedding model (mean
and last-token pooling) beside the same file as a generative model. The vectors are checked
against llama-cpp-python's own embedding path on the same GGUF, batched against alone, in both
encodings and through the OpenAI SDK; misuse is refused with the field named."""

from __future__ import annotations

import base64

import httpx
import llama_cpp
import numpy as np
import openai
import pytest

from appliance.engine import native
from conftest import SMOLLM2, model_entry
from opshelp import metric

TEXTS = ["The cat sat on the mat.", "Quarterly revenue grew five percent.", "Hi",
         "A much longer sentence about the weather in Oslo during the dark winter months of the year."]


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory(
        {
            "models": [
                model_entry("smollm2-135m", SMOLLM2, n_parallel=1),
                model_entry("embed", SMOLLM2, n_ctx=512, n_parallel=4, n_batch=128, embedding=True),
                model_entry("embed-last", SMOLLM2, n_ctx=256, n_parallel=2, n_batch=64, embedding=True,
                            pooling="last"),
            ],
        },
        "embeddings",
    )


def post(server, body: dict, path: str = "/v1/embeddings") -> httpx.Response:
    return httpx.post(server.base + path, json=body, timeout=120)


def vectors(server, model: str, inp, **kw) -> np.ndarray:
    r = post(server, {"model": model, "input": inp, **kw})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == model
    assert [d["index"] for d in body["data"]] == list(range(len(body["data"])))
    if kw.get("encoding_format") == "base64":
        return np.array([np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in body["data"]])
    return np.array([d["embedding"] for d in body["data"]])


def reference(texts: list[str], pooling: int) -> np.ndarray:
    """The same GGUF through llama-cpp-python's high-level embedding path, normalised; with pooling
    none, the mean of each input's token states."""
    native.init_backend()  # ggml's backend modules (GGML_BACKEND_DL)
    model = llama_cpp.Llama(str(SMOLLM2), embedding=True, pooling_type=pooling, n_ctx=512, n_batch=128,
                            n_threads=2, verbose=False)
    try:
        if pooling == llama_cpp.LLAMA_POOLING_TYPE_NONE:
            ref = np.array([np.mean(model.embed(t, normalize=False), axis=0) for t in texts], dtype=np.float64)
        else:
            ref = np.array(model.embed(texts, normalize=False), dtype=np.float64)
    finally:
        model.close()
    return ref / np.linalg.norm(ref, axis=1, keepdims=True)


@pytest.mark.parametrize("model, pooling", [("embed", llama_cpp.LLAMA_POOLING_TYPE_MEAN),
                                            ("embed-last", llama_cpp.LLAMA_POOLING_TYPE_LAST)])
def test_vectors_are_llama_cpps_pooled_states_normalised_and_batched_as_alone(server, model, pooling):
    batch = vectors(server, model, TEXTS)
    assert batch.shape == (len(TEXTS), 576)
    assert np.allclose(np.linalg.norm(batch, axis=1), 1.0, atol=1e-5)
    cosines = (batch * reference(TEXTS, pooling)).sum(axis=1)
    assert (cosines > 0.999).all(), cosines
    alone = np.array([vectors(server, model, t)[0] for t in TEXTS])
    # each input is its own sequence: its neighbours change only the rounding. A decode's row count
    # picks the matrix kernels' paths (the same request gives the same bits): on an AMD EPYC up to
    # 3.2e-5 of cosine with mean pooling and 3.2e-4 with the last token's state alone; under 1e-5
    # on an Intel Xeon
    assert ((batch * alone).sum(axis=1) > 1 - 1e-3).all()
    other = "mean" if model == "embed-last" else "last"
    assert ((batch * reference(TEXTS, 1 if other == "mean" else 3)).sum(axis=1) < 0.99).any()


def test_the_pooling_context_skips_the_output_layer(server):
    """Patch 0017: the embedding model's context computes no logits, so its compute and output
    buffers together are smaller than one batch of SmolLM2's logits alone (128 rows of 49152), and
    a mean-pooled vector is the mean of the per-token states that llama.cpp computes with pooling
    none, a graph that keeps the output layer (one sequence a context: the same sums)."""
    status = httpx.get(server.base + "/v1/admin/vram/status", timeout=30).json()
    sizes = {m["name"]: m["compute_bytes"] for m in status["models"]}
    assert 0 < sizes["embed"] < 128 * 49152 * 4, sizes
    assert sizes["smollm2-135m"] > 49152 * 4  # the generative context keeps its logits
    means = reference(TEXTS, llama_cpp.LLAMA_POOLING_TYPE_NONE)
    assert np.abs(means - reference(TEXTS, llama_cpp.LLAMA_POOLING_TYPE_MEAN)).max() < 1e-6
    alone = np.array([vectors(server, "embed", t)[0] for t in TEXTS])
    assert ((alone * means).sum(axis=1) > 1 - 1e-3).all()


def test_encodings_token_ids_and_the_openai_sdk_agree(server):
    floats = vectors(server, "embed", TEXTS[:2])
    b64 = vectors(server, "embed", TEXTS[:2], encoding_format="base64")
    assert np.array_equal(floats.astype("<f4"), b64)
    ids = httpx.post(server.base + "/tokenize", json={"model": "embed", "content": TEXTS[0]}).json()["tokens"]
    # another batch: the same vector up to the rounding of the batched-as-alone test
    assert (vectors(server, "embed", ids)[0] * floats[0]).sum() > 1 - 2e-4
    assert (vectors(server, "embed", [ids, ids])[1] * floats[0]).sum() > 1 - 2e-4
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="unused", max_retries=0)
    sdk = client.embeddings.create(model="embed", input=TEXTS[:2])  # the SDK asks for base64
    assert np.abs(np.array([d.embedding for d in sdk.data]) - floats).max() < 1e-6  # the same batch
    assert sdk.usage.prompt_tokens == sdk.usage.total_tokens > 8
    text = httpx.get(server.base + "/metrics").text
    assert metric(text, "eie_embedded_inputs_total", model="embed") >= 10


def test_many_inputs_beside_generation_on_the_same_file(server):
    many = [f"Sentence number {i} about item {i * 7 % 13}." for i in range(40)]  # 10 decodes of 4 sequences
    got = vectors(server, "embed", many)
    assert got.shape == (40, 576) and np.allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    assert (got[17] * vectors(server, "embed", many[17])[0]).sum() > 1 - 2e-4
    r = post(server, {"model": "smollm2-135m", "prompt": "The capital of France is", "max_tokens": 4,
                      "temperature": 0}, "/v1/completions")
    assert r.status_code == 200 and r.json()["choices"][0]["text"].strip()


@pytest.mark.parametrize("path, body, status, param", [
    ("/v1/embeddings", {"model": "smollm2-135m", "input": "x"}, 400, "model"),
    ("/v1/completions", {"model": "embed", "prompt": "x"}, 400, "model"),
    ("/v1/chat/completions", {"model": "embed", "messages": [{"role": "user", "content": "x"}]}, 400, "model"),
    ("/v1/embeddings", {"model": "embed", "input": "word " * 200}, 400, "input"),
    ("/v1/embeddings", {"model": "embed", "input": ["fine", "word " * 200]}, 400, "input[1]"),
    ("/v1/embeddings", {"model": "embed", "input": ["fine", ""]}, 400, "input[1]"),
    ("/v1/embeddings", {"model": "embed", "input": []}, 400, "input"),
    ("/v1/embeddings", {"model": "embed", "input": [[1, 2], [10**9]]}, 400, "input[1]"),
    ("/v1/embeddings", {"model": "embed", "input": "x", "dimensions": 128}, 400, "dimensions"),
    ("/v1/embeddings", {"model": "embed", "input": "x", "encoding_format": "int8"}, 400, "encoding_format"),
    ("/v1/embeddings", {"model": "nope", "input": "x"}, 404, "model"),
])
def test_misuse_is_refused_with_the_field_named(server, path, body, status, param):
    r = post(server, body, path)
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param


def test_an_embedding_model_cannot_be_a_group_member():
    from appliance.config import ConfigError, parse_config

    models = [{"name": "e", "path": "e.gguf", "embedding": True}, {"name": "g", "path": "g.gguf"}]
    for group, key in (({"models": ["g", "e"]}, "groups[0].models[1]"),
                       ({"models": ["g"], "fallback": {"replace_with": "e"}}, "groups[0].fallback.replace_with"),
                       ({"models": ["g"], "type": "fanout", "select": "judge:e"}, "groups[0].select")):
        with pytest.raises(ConfigError) as e:
            parse_config({"models": models, "groups": [{"name": "both", **group}]})
        line = next(ln for ln in str(e.value).splitlines() if key in ln)
        assert "'e' is an embedding model" in line
