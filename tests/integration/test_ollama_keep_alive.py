"""Ollama's keep_alive through the real server: under `generic` (models loaded on demand) a
request's keep_alive sets how long its model stays loaded once idle (0: unloaded after the answer;
negative: kept), an empty request with keep_alive 0 unloads the model now, `/api/ps` says when
the model expires; where the strategy keeps a model loaded (fixed-appliance), keep_alive changes
nothing and an unload is refused by name."""

from __future__ import annotations

import time
from datetime import datetime, timezone

import httpx
import numpy as np
import ollama
import pytest

from conftest import SMOLLM2, model_entry

ASK = [{"role": "user", "content": "Name a fruit."}]
OPTIONS = {"temperature": 0, "num_predict": 4}


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory({"policy": {"strategy": "generic", "keep_alive_s": 600},
                           "models": [model_entry("smol", SMOLLM2, n_parallel=1),
                                      model_entry("emb", SMOLLM2, n_ctx=512, n_parallel=1, embedding=True)]},
                          "keep-alive")


@pytest.fixture(scope="module")
def client(server) -> ollama.Client:
    return ollama.Client(host=server.base, timeout=300)


def state(server, name: str = "smol") -> str:
    models = httpx.get(server.base + "/v1/models", timeout=30).json()["data"]
    return next(m for m in models if m["id"] == name)["state"]


def wait_state(server, want: str, within_s: float = 10.0) -> None:
    end = time.monotonic() + within_s
    while state(server) != want:
        assert time.monotonic() < end, f"still {state(server)}, not {want}"
        time.sleep(0.1)


def expires_in(client, name: str = "smol") -> float:
    running = {m.model: m for m in client.ps().models}
    return (running[name].expires_at - datetime.now(timezone.utc)).total_seconds()


def test_keep_alive_zero_unloads_after_the_answer(server, client):
    client.chat(model="smol", messages=ASK, options=OPTIONS)
    assert state(server) == "ready"
    answer = client.chat(model="smol", messages=ASK, options=OPTIONS, keep_alive=0)
    assert answer.message.content
    wait_state(server, "unloaded", within_s=5)
    client.chat(model="smol", messages=ASK, options=OPTIONS)  # loaded again, under the strategy's 600 s
    time.sleep(1)
    assert state(server) == "ready"


def test_an_empty_request_with_keep_alive_zero_unloads_now(server, client):
    client.generate(model="smol", prompt="Hi", options=OPTIONS)
    r = httpx.post(server.base + "/api/generate", json={"model": "smol", "keep_alive": 0}, timeout=60)
    assert r.status_code == 200 and r.json()["done_reason"] == "unload", r.text
    assert state(server) == "unloaded"
    r = httpx.post(server.base + "/api/chat", json={"model": "smol:latest", "messages": [], "keep_alive": "0s"},
                   timeout=60)
    assert r.status_code == 200 and r.json()["done_reason"] == "unload", r.text
    load = httpx.post(server.base + "/api/generate", json={"model": "smol"}, timeout=120)  # Ollama's load
    assert load.json()["done_reason"] == "load" and state(server) == "ready"


def test_ps_says_when_the_model_expires(server, client):
    client.chat(model="smol", messages=ASK, options=OPTIONS, keep_alive="2m")
    assert 100 < expires_in(client) <= 120
    client.chat(model="smol", messages=ASK, options=OPTIONS)  # no keep_alive: the strategy's 600 s again
    assert 580 < expires_in(client) <= 600
    client.chat(model="smol", messages=ASK, options=OPTIONS, keep_alive=-1)
    assert expires_in(client) > 365 * 86400  # kept


def test_a_short_keep_alive_unloads_once_idle(server, client):
    client.chat(model="smol", messages=ASK, options=OPTIONS, keep_alive=1.5)
    assert state(server) == "ready"
    wait_state(server, "unloaded", within_s=6)


@pytest.mark.parametrize("value", ["5 minutes", "1d", True, [1], ""])
def test_an_unreadable_keep_alive_is_refused_by_name(server, value):
    r = httpx.post(server.base + "/api/chat", json={"model": "smol", "messages": ASK, "keep_alive": value}, timeout=60)
    assert r.status_code == 400 and r.json()["param"] == "keep_alive", r.text


def test_a_fixed_appliance_keeps_its_models(server_factory):
    srv = server_factory({"models": [model_entry("smol", SMOLLM2, n_parallel=1)]}, "keep-alive-fixed")
    client = ollama.Client(host=srv.base, timeout=300)
    client.chat(model="smol", messages=ASK, options=OPTIONS, keep_alive=0)
    time.sleep(1)
    assert state(srv) == "ready"
    r = httpx.post(srv.base + "/api/generate", json={"model": "smol", "keep_alive": 0}, timeout=60)
    assert r.status_code == 409 and "never unloads" in r.json()["error"], r.text
    assert expires_in(client) > 365 * 86400


def test_an_embedding_model_loads_and_unloads_the_ollama_way(server, client):
    # no input is Ollama's load (and, with keep_alive 0, its unload) on both embedding routes:
    # both were 400s, so an embedding model could not be unloaded the Ollama way
    def emb_state(want: str) -> None:
        end = time.monotonic() + 10
        while state(server, "emb") != want:
            assert time.monotonic() < end, f"emb still {state(server, 'emb')}, not {want}"
            time.sleep(0.1)

    r = httpx.post(server.base + "/api/embed", json={"model": "emb"}, timeout=120)
    assert r.status_code == 200 and r.json()["embeddings"] == [], r.text
    emb_state("ready")
    r = httpx.post(server.base + "/api/embed", json={"model": "emb", "keep_alive": 0}, timeout=60)
    assert r.status_code == 200 and r.json()["embeddings"] == [], r.text
    emb_state("unloaded")
    r = httpx.post(server.base + "/api/embeddings", json={"model": "emb", "prompt": ""}, timeout=120)
    assert r.status_code == 200 and r.json() == {"embedding": []}, r.text
    emb_state("ready")
    # /api/embeddings takes its keep_alive too
    client.embeddings(model="emb", prompt="hello", keep_alive="30s")
    assert 20 < expires_in(client, "emb") <= 30
    # dimensions: the first ones, normalised again, as Ollama's (a 400 before)
    full = np.array(client.embed(model="emb", input="hello").embeddings[0])
    cut = np.array(client.embed(model="emb", input="hello", dimensions=64).embeddings[0])
    assert cut.shape == (64,) and np.allclose(cut, full[:64] / np.linalg.norm(full[:64]), atol=1e-6)


def test_a_keep_alive_past_any_date_is_forever_and_ps_still_answers(server, client):
    # "forever" as a big number: /api/ps was a 500 for every client (the expiry's date overflowed)
    r = httpx.post(server.base + "/api/generate", json={"model": "smol", "keep_alive": 1e12}, timeout=120)
    assert r.status_code == 200, r.text
    ps = httpx.get(server.base + "/api/ps", timeout=30)
    assert ps.status_code == 200, ps.text
    smol = next(m for m in ps.json()["models"] if m["name"] == "smol")
    assert smol["expires_at"] == "9999-12-31T23:59:59Z"
    client.chat(model="smol", messages=ASK, options=OPTIONS)  # the strategy's keep-alive again


def test_a_request_of_another_api_goes_back_to_the_strategys_keep_alive(server, client):
    # an Ollama keep_alive 0 held for every later request of every API: each OpenAI request
    # unloaded the model after it (Ollama's own OpenAI routes take the default again)
    client.chat(model="smol", messages=ASK, options=OPTIONS, keep_alive=0)
    wait_state(server, "unloaded", within_s=5)
    r = httpx.post(server.base + "/v1/chat/completions", timeout=120, json={
        "model": "smol", "messages": ASK, "max_tokens": 2})
    assert r.status_code == 200
    time.sleep(1.5)
    assert state(server) == "ready"
    assert 580 < expires_in(client) <= 600
