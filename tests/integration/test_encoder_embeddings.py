"""Sentence encoders (llama.cpp's `bert` architecture: no KV cache, no output layer, every token
an output) served through the real server as embedding models and as a reranker (a cross-encoder
with a classification head, pooling rank), beside a generative model. The models are tiny
random-weight BERTs written by tests/tiny_bert.py (no BERT GGUF ships on PyPI); their vectors and
scores are checked against BERT computed in numpy from the same file's tensors, and the vectors
also against llama-cpp-python's own embedding path."""

from __future__ import annotations

import concurrent.futures

import httpx
import llama_cpp
import numpy as np
import pytest

from appliance.engine import native
from conftest import SMOLLM2, model_entry
from tiny_bert import forward, write_tiny_bert

TEXTS = ["The cat sat on the mat.", "Quarterly revenue grew five percent.", "Hi",
         "A much longer sentence about the weather in Oslo during the dark winter months of the year."]
N_CTX_TRAIN = 128
TEMPLATE = "[CLS] {document} [SEP] the {query} [SEP]"  # not the pair rerank_pair makes: the prompt is used


@pytest.fixture(scope="module")
def berts(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-bert")
    return {"mean": write_tiny_bert(d / "bert-mean.gguf", n_ctx_train=N_CTX_TRAIN, pooling=1),
            "cls": write_tiny_bert(d / "bert-cls.gguf", n_ctx_train=N_CTX_TRAIN, pooling=2, seed=1),
            "rank": write_tiny_bert(d / "reranker.gguf", n_ctx_train=N_CTX_TRAIN, pooling=4, head=True, seed=2),
            "templated": write_tiny_bert(d / "reranker-prompt.gguf", n_ctx_train=N_CTX_TRAIN, pooling=4, head=True,
                                         seed=2, rerank_template=TEMPLATE)}


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
                model_entry("reranker", berts["rank"], n_ctx=256, n_parallel=4, n_batch=256, embedding=True),
                model_entry("bert-rank", berts["mean"], n_ctx=256, n_parallel=1, embedding=True, pooling="rank"),
                model_entry("reranker-prompt", berts["templated"], n_ctx=256, n_parallel=2, n_batch=256,
                            embedding=True),
            ],
        },
        "encoder-embeddings",
    )


def vectors(server, model: str, inp) -> np.ndarray:
    r = httpx.post(server.base + "/v1/embeddings", json={"model": model, "input": inp}, timeout=60)
    assert r.status_code == 200, r.text
    return np.array([d["embedding"] for d in r.json()["data"]])


def tokens(server, model: str, text: str, add_special: bool = True) -> list[int]:
    r = httpx.post(server.base + "/tokenize", json={"model": model, "content": text, "add_special": add_special})
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def rerank(server, body: dict, path: str = "/v1/rerank") -> httpx.Response:
    return httpx.post(server.base + path, json={"model": "reranker", **body}, timeout=60)


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
    name = {llama_cpp.LLAMA_POOLING_TYPE_MEAN: "mean", llama_cpp.LLAMA_POOLING_TYPE_CLS: "cls"}[pooling]
    bert = np.array([forward(berts[gguf], tokens(server, model, t), name) for t in TEXTS])
    assert ((batch * bert).sum(axis=1) / np.linalg.norm(bert, axis=1) > 1 - 1e-5).all()
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


DOCS = ["The cat sat on the mat.", "Quarterly revenue grew five percent.", "hello world",
        "A much longer sentence about the weather in Oslo.", "the dog"]


def test_a_reranker_scores_every_pair_as_bert_does_and_sorts_them(server, berts):
    query = "the cat on a mat"
    r = rerank(server, {"query": query, "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "reranker" and body["object"] == "list"
    got = {x["index"]: x["relevance_score"] for x in body["results"]}
    assert sorted(got) == list(range(len(DOCS))) and all("document" not in x for x in body["results"])
    assert [x["relevance_score"] for x in body["results"]] == sorted(got.values(), reverse=True)
    # each pair as a BERT cross-encoder reads it: [CLS] query [SEP] document [SEP]
    q = tokens(server, "reranker", query, add_special=False)
    pairs = [[101, *q, 102, *tokens(server, "reranker", d, add_special=False), 102] for d in DOCS]
    assert body["usage"]["prompt_tokens"] == body["usage"]["total_tokens"] == sum(map(len, pairs))
    bert = [float(forward(berts["rank"], p, "rank")[0]) for p in pairs]
    assert np.allclose([got[i] for i in range(len(DOCS))], bert, rtol=1e-3, atol=1e-3), (got, bert)
    assert len(set(np.round(bert, 2))) == len(DOCS)  # distinct scores: the order is the model's
    alone = [rerank(server, {"query": query, "documents": [d]}).json()["results"][0]["relevance_score"] for d in DOCS]
    assert np.allclose(alone, [got[i] for i in range(len(DOCS))], rtol=1e-5, atol=1e-5)


def test_top_n_documents_as_objects_and_the_llama_server_path(server):
    full = rerank(server, {"query": "revenue", "documents": DOCS}).json()["results"]
    r = rerank(server, {"query": "revenue", "documents": [{"text": d} for d in DOCS], "top_n": 2,
                        "return_documents": True}, path="/rerank")
    assert r.status_code == 200, r.text
    top = r.json()["results"]
    assert [x["index"] for x in top] == [x["index"] for x in full[:2]]
    assert [x["document"]["text"] for x in top] == [DOCS[x["index"]] for x in full[:2]]


def test_a_rerank_prompt_in_the_gguf_makes_the_pairs(server, berts):
    """A GGUF's `tokenizer.chat_template.rerank` (Qwen3-Reranker's converter writes one) is filled
    and read with its special tokens, as llama-server does; a document whose text is a special
    token is refused."""
    query = "cat"
    r = rerank(server, {"model": "reranker-prompt", "query": query, "documents": DOCS[:3]})
    assert r.status_code == 200, r.text
    got = {x["index"]: x["relevance_score"] for x in r.json()["results"]}
    ids = [[101, *tokens(server, "reranker-prompt", d, add_special=False), 102,
            *tokens(server, "reranker-prompt", f"the {query}", add_special=False), 102] for d in DOCS[:3]]
    bert = [float(forward(berts["templated"], p, "rank")[0]) for p in ids]
    assert np.allclose([got[i] for i in range(3)], bert, rtol=1e-3, atol=1e-3), (got, bert)
    plain = rerank(server, {"query": query, "documents": DOCS[:3]}).json()["results"]  # same weights, own pairs
    assert not np.allclose(sorted(x["relevance_score"] for x in plain), sorted(got.values()), atol=1e-3)
    r = rerank(server, {"model": "reranker-prompt", "query": query, "documents": ["fine", "a [SEP] b"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "documents[1]", r.text


def test_a_model_without_a_classification_head_cannot_rerank(server):
    model = httpx.get(server.base + "/health").json()["models"]["bert-rank"]
    assert model["state"] == "failed" and "has no classification head" in model["error"]


@pytest.mark.parametrize("path, body, param", [
    ("/v1/rerank", {"model": "bert", "query": "q", "documents": ["d"]}, "model"),
    ("/v1/rerank", {"model": "smollm2-135m", "query": "q", "documents": ["d"]}, "model"),
    ("/v1/embeddings", {"model": "reranker", "input": "x"}, "model"),
    ("/v1/rerank", {"model": "reranker", "query": "", "documents": ["d"]}, "query"),
    ("/v1/rerank", {"model": "reranker", "query": "q", "documents": []}, "documents"),
    ("/v1/rerank", {"model": "reranker", "query": "q", "documents": ["fine", "cat " * 200]}, "documents[1]"),
    ("/v1/rerank", {"model": "reranker", "query": "q", "documents": [{"txt": "d"}]}, "documents[0]"),
    ("/v1/rerank", {"model": "reranker", "query": "q", "documents": ["d"], "top_n": 0}, "top_n"),
    ("/v1/rerank", {"model": "reranker", "documents": ["d"]}, "query"),
])
def test_rerank_misuse_is_refused_with_the_field_named(server, path, body, param):
    r = httpx.post(server.base + path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_the_model_list_says_what_each_model_serves(server):
    cards = {c["id"]: c for c in httpx.get(server.base + "/v1/models").json()["data"]}
    assert cards["bert"]["kind"] == "embedding" and cards["bert"]["context_length"] == 256
    assert cards["reranker"]["kind"] == "rerank" and cards["bert-rank"]["kind"] == "rerank"
    assert cards["bert"]["tool_format"] is None and cards["bert"]["reasoning"] is None
    chat = cards["smollm2-135m"]
    assert chat["kind"] == "chat" and chat["tool_format"] == "eie" and chat["reasoning"] is False
    assert chat["object"] == "model" and chat["owned_by"] == "eie"
