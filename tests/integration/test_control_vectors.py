"""Control vectors on SmolLM2 through the real server (models[].control_vectors): a direction at
the last layer along a token's output embedding makes the model write that token; the same file
at +1 and -1 (summed to nothing) and a layer range that leaves the direction's layer out answer
as the model alone, bit for bit; the vector survives a KV type change (a new context); a steered
model's prefixes are not restored for the model alone, or the other way round; and a file of
another width fails the load by name."""

from __future__ import annotations

import gguf
import httpx
import numpy as np
import pytest

from conftest import SMOLLM2, model_entry
from control_vectors import write_control_vector

QUESTION = "Name three colors."
SYSTEM = "You are a helpful assistant. " * 40  # a prefix of whole cache blocks


def steering(path=SMOLLM2) -> tuple[int, int, np.ndarray]:
    """(n_layer, token, direction): the token whose output embedding wins most clearly when the
    normed last hidden state points along it, and a direction at the last layer that points it so
    (divided by the final norm's weight, large enough that the layer's own output is noise)."""
    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    n_layer = int(reader.fields["llama.block_count"].contents())
    out = tensors.get("output.weight") or tensors["token_embd.weight"]  # SmolLM2 ties them
    rows = gguf.quants.dequantize(out.data, out.tensor_type).astype(np.float32)
    norm = np.asarray(tensors["output_norm.weight"].data, dtype=np.float32)
    best, token = -1.0, -1
    for first in range(1000, 2000, 250):
        chosen = np.arange(first, first + 250)
        scores = rows[chosen] @ rows.T
        own = scores[np.arange(len(chosen)), chosen].copy()
        scores[np.arange(len(chosen)), chosen] = -np.inf
        margins = (own - scores.max(axis=1)) / own
        if margins.max() > best:
            best, token = float(margins.max()), int(chosen[margins.argmax()])
    assert best > 0.2, best  # its own row beats every other by that share of its score
    unit = rows[token] / np.linalg.norm(rows[token])
    return n_layer, token, 1e4 * unit / norm


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("cvec")
    n_layer, token, direction = steering()
    last = n_layer - 1  # llama.cpp's layers that can be steered are 1..n_layer-1
    write_control_vector(d / "steer.gguf", {last: direction})
    rng = np.random.default_rng(3)
    write_control_vector(d / "middle.gguf", {10: rng.standard_normal(576) * 2})
    write_control_vector(d / "narrow.gguf", {2: np.ones(64)})
    return {"dir": d, "token": token, "last": last}


@pytest.fixture(scope="module")
def srv(server_factory, files, tmp_path_factory):
    d, last = files["dir"], files["last"]
    disk = {"disk": {"path": str(tmp_path_factory.mktemp("cvec-kv"))}}

    def entry(name: str, **kw) -> dict:
        return model_entry(name, SMOLLM2, n_ctx=1024, n_parallel=1, kv_cache=disk, **kw)

    return server_factory({"models": [
        entry("base"),
        entry("steered", control_vectors=[{"path": str(d / "steer.gguf")}]),
        entry("cancelled", control_vectors=[{"path": str(d / "steer.gguf")},
                                            {"path": str(d / "steer.gguf"), "scale": -1}]),
        entry("outside", control_vectors=[{"path": str(d / "steer.gguf")}], control_vector_layers=[1, last - 1]),
        entry("middle", control_vectors=[{"path": str(d / "middle.gguf"), "scale": 0.5}]),
        entry("narrow", control_vectors=[{"path": str(d / "narrow.gguf")}]),
    ]}, "control-vectors")


def chat(srv, model: str, question: str = QUESTION, system: str | None = None, max_tokens: int = 12) -> dict:
    messages = [{"role": "system", "content": system}] if system else []
    r = httpx.post(srv.base + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": [*messages, {"role": "user", "content": question}], "max_tokens": max_tokens,
        "temperature": 0, "logprobs": True})
    assert r.status_code == 200, r.text
    return r.json()


def answer(srv, model: str, **kw) -> tuple[str, list[float]]:
    choice = chat(srv, model, **kw)["choices"][0]
    return choice["message"]["content"], [t["logprob"] for t in choice["logprobs"]["content"]]


def test_a_direction_along_a_tokens_output_row_makes_the_model_write_it(srv, files):
    piece = httpx.post(srv.base + "/detokenize", json={"model": "base", "tokens": [files["token"]]}).json()["content"]
    choice = chat(srv, "steered")["choices"][0]
    assert [t["token"] for t in choice["logprobs"]["content"]] == [piece] * 12, choice
    assert answer(srv, "base")[0] != choice["message"]["content"]


def test_summed_to_nothing_or_outside_its_layers_it_answers_as_the_model_alone(srv):
    alone = answer(srv, "base")
    assert answer(srv, "cancelled") == alone  # text and log-probabilities, bit for bit
    assert answer(srv, "outside") == alone


def test_a_middle_layer_direction_changes_the_answer(srv):
    assert answer(srv, "middle") != answer(srv, "base")


def test_the_models_list_names_the_files_and_memory_counts_the_vector(srv, files):
    cards = {c["id"]: c for c in httpx.get(srv.base + "/v1/models").json()["data"]}
    assert cards["cancelled"]["control_vectors"] == [str(files["dir"] / "steer.gguf")] * 2
    assert cards["base"]["control_vectors"] is None
    models = {m["name"]: m for m in httpx.get(srv.base + "/v1/admin/vram/status").json()["models"]}
    # llama.cpp allocates one F32 vector of the model's width per layer from 1
    assert models["steered"]["lora_adapter_bytes"] == (files["last"]) * 576 * 4
    assert models["base"]["lora_adapter_bytes"] == 0


def test_a_steered_model_restores_no_prefix_saved_without_its_vector(server_factory, files, tmp_path):
    """Prefixes on disk are per model file and KV types; a control vector changes every state
    after its layer, so its prefixes are keyed by it too: after a restart that adds a vector, the
    model does not restore what it saved without one (while the same file without one does)."""
    disk = {"disk": {"path": str(tmp_path)}}
    first = server_factory({"models": [model_entry("m", SMOLLM2, n_ctx=1024, n_parallel=1, kv_cache=disk)]},
                           "cvec-before")
    chat(first, "m", system=SYSTEM, max_tokens=2)
    first.stop()  # SIGTERM: queued disk writes are finished first
    assert list(tmp_path.glob("*/*.kv"))
    middle = [{"path": str(files["dir"] / "middle.gguf"), "scale": 0.5}]
    second = server_factory({"models": [
        model_entry("m", SMOLLM2, n_ctx=1024, n_parallel=1, kv_cache=disk, control_vectors=middle),
        model_entry("alone", SMOLLM2, n_ctx=1024, n_parallel=1, kv_cache=disk),
    ]}, "cvec-after")
    steered = chat(second, "m", system=SYSTEM, max_tokens=2)
    assert steered["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    alone = chat(second, "alone", system=SYSTEM, max_tokens=2)
    assert alone["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_the_vector_holds_across_a_kv_type_change(srv):
    """A KV type change makes a new context, which applies the vector again."""
    steered = chat(srv, "steered")["choices"][0]["message"]["content"]
    for model in ("steered", "middle", "base"):
        r = httpx.post(srv.base + "/v1/admin/kv/convert", json={"model": model, "mode": "q8_0"})
        assert r.status_code == 200, r.text
    assert chat(srv, "steered")["choices"][0]["message"]["content"] == steered
    assert answer(srv, "middle") != answer(srv, "base")  # both on q8_0 now


def test_a_vector_of_another_width_fails_the_load_by_name(srv):
    health = httpx.get(srv.base + "/health").json()["models"]["narrow"]
    assert health["state"] == "failed"
    assert "narrow.gguf" in health["error"] and "64" in health["error"] and "576 wide" in health["error"], health

