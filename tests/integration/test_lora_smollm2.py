"""LoRA adapters on SmolLM2 through the real server: answers of concurrent requests of the model
and its adapters are exactly those each gives alone, a group runs a model beside its own adapter
on one set of weights, and an adapter that does not fit its model fails the load by name."""

from __future__ import annotations

import concurrent.futures

import httpx
import yaml
import pytest

from conftest import GEMMA3, SMOLLM2, model_entry
from lora_adapter import write_lora

QUESTIONS = ["What is the capital of France?", "Name three colors.", "Write a haiku about rain.",
             "How many legs does a spider have?"]


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    d = tmp_path_factory.mktemp("smollm2-lora")
    write_lora(SMOLLM2, d / "smollm2-lora.gguf", targets=("attn_q", "attn_v", "ffn_up"), rank=8, strength=0.3)
    write_lora(GEMMA3, d / "gemma-lora.gguf", targets=("attn_q",), rank=4)
    return d


@pytest.fixture(scope="module")
def srv(server_factory, adapters):
    return server_factory({
        "models": [
            model_entry("smollm2", SMOLLM2, n_ctx=1024, n_parallel=8,
                        speculative={"sources": ["ngram", "history"]},
                        lora=[{"name": "smollm2-tuned", "path": str(adapters / "smollm2-lora.gguf")}]),
            # an adapter for another model: the load fails and says which adapter and why
            model_entry("mismatched", SMOLLM2, n_ctx=512, n_parallel=1,
                        lora=[{"name": "mismatched-gemma", "path": str(adapters / "gemma-lora.gguf")}]),
        ],
        "groups": [{"name": "both", "type": "parallel", "models": ["smollm2", "smollm2-tuned"]}],
    }, "lora-smollm2")


def chat(srv, model: str, question: str, max_tokens: int = 32, **kw) -> tuple[str, list[float]]:
    r = httpx.post(srv.base + "/v1/chat/completions", timeout=180, json={
        "model": model, "messages": [{"role": "user", "content": question}], "max_tokens": max_tokens,
        "temperature": 0, "logprobs": True, **kw})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    return choice["message"]["content"], [t["logprob"] for t in choice["logprobs"]["content"]]


def test_concurrent_model_and_adapter_answer_as_alone(srv):
    jobs = [(m, q) for m in ("smollm2", "smollm2-tuned") for q in QUESTIONS]
    alone = {job: chat(srv, *job) for job in jobs}
    assert all(alone[("smollm2", q)] != alone[("smollm2-tuned", q)] for q in QUESTIONS)
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        together = dict(zip(jobs, pool.map(lambda job: chat(srv, *job), jobs)))
    assert together == alone  # texts and log-probabilities, bit for bit


def test_sets_take_turns_of_several_steps(srv):
    """Two streams of two sets: a change of set costs a scheduler reserve, so each set keeps the
    context for several steps (engine/adapter_turns.py), not one: fewer switches than tokens."""
    def switches() -> int:
        return httpx.get(srv.base + "/v1/admin/scheduling/status").json()["models"]["smollm2"]["adapter_switches"]

    chat(srv, "smollm2-tuned", QUESTIONS[0], 4)  # a switch measured
    before = switches()
    jobs = [("smollm2", QUESTIONS[2]), ("smollm2-tuned", QUESTIONS[2])]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        answers = list(pool.map(lambda job: chat(srv, *job, max_tokens=64, speculative=False,
                                                 logit_bias={"2": -100}), jobs))
    assert all(len(logprobs) == 64 for _, logprobs in answers)
    # one set a step, switching every step, would be about 128 switches
    assert 0 < switches() - before < 64, switches() - before


def test_speculation_keeps_an_adapters_greedy_answer(srv):
    """Drafts verified in one decode with the adapter give the answer of one token a step."""
    for q in QUESTIONS + ["Repeat after me: one two three one two three one two three"]:
        assert chat(srv, "smollm2-tuned", q, 48) == chat(srv, "smollm2-tuned", q, 48, speculative=False), q
    stats = httpx.get(srv.base + "/v1/admin/scheduling/status").json()
    assert stats["models"]["smollm2"]["speculative"]["accepted"] > 0, stats["models"]["smollm2"]
    assert stats["models"]["smollm2"]["adapter_switches"] > 0


def test_group_of_a_model_and_its_adapter(srv):
    r = httpx.post(srv.base + "/v1/batch/execute", timeout=180, json={
        "group": "both", "messages": [{"role": "user", "content": QUESTIONS[0]}], "max_tokens": 32,
        "temperature": 0})
    assert r.status_code == 200, r.text
    members = {m["model"]: m for m in r.json()["members"]}
    assert set(members) == {"smollm2", "smollm2-tuned"}
    assert members["smollm2"]["text"] == chat(srv, "smollm2", QUESTIONS[0])[0]
    assert members["smollm2-tuned"]["text"] == chat(srv, "smollm2-tuned", QUESTIONS[0])[0]


def test_adapter_of_another_model_fails_the_load_by_name(srv):
    health = httpx.get(srv.base + "/health").json()
    error = health["models"]["mismatched"]["error"]
    assert health["models"]["mismatched"]["state"] == "failed"
    assert "'mismatched-gemma'" in error and "gemma-lora.gguf" in error
    assert "arch" in error  # llama.cpp's reason: model arch and LoRA arch mismatch
    r = httpx.post(srv.base + "/v1/chat/completions", timeout=30, json={
        "model": "mismatched-gemma", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert r.status_code == 503 and r.json()["error"]["param"] == "model"


def test_every_api_serves_an_adapter_by_its_name(srv):
    """Responses, Anthropic Messages and Ollama take the adapter's name as any model's, with the
    adapter's greedy answer; Ollama lists and shows it."""
    want = chat(srv, "smollm2-tuned", QUESTIONS[1], 8)[0]
    r = httpx.post(srv.base + "/v1/responses", timeout=60, json={
        "model": "smollm2-tuned", "input": QUESTIONS[1], "max_output_tokens": 8, "temperature": 0})
    assert r.status_code == 200 and r.json()["model"] == "smollm2-tuned", r.text
    assert r.json()["output"][0]["content"][0]["text"] == want
    r = httpx.post(srv.base + "/v1/messages", timeout=60, json={
        "model": "smollm2-tuned", "max_tokens": 8, "temperature": 0,
        "messages": [{"role": "user", "content": QUESTIONS[1]}]})
    assert r.status_code == 200 and r.json()["content"][0]["text"] == want, r.text
    r = httpx.post(srv.base + "/api/chat", timeout=60, json={
        "model": "smollm2-tuned", "stream": False, "options": {"num_predict": 8, "temperature": 0},
        "messages": [{"role": "user", "content": QUESTIONS[1]}]})
    assert r.status_code == 200 and r.json()["message"]["content"] == want and r.json()["model"] == "smollm2-tuned"
    tags = [m["name"] for m in httpx.get(srv.base + "/api/tags").json()["models"]]
    assert tags.index("smollm2-tuned") == tags.index("smollm2") + 1
    shown = httpx.post(srv.base + "/api/show", json={"model": "smollm2-tuned"})
    assert shown.status_code == 200 and "completion" in shown.json()["capabilities"]


def test_a_reload_changes_an_adapters_scale_live(srv):
    """models[].lora[i].scale applies at a reload without a load: at 0 the adapter's name serves
    the model's own answer, and back at 1 its first one; the GET /lora-adapters list follows. A
    set POST /lora-adapters gave is dropped by a reload that changes the model's adapters."""
    tuned = chat(srv, "smollm2-tuned", QUESTIONS[0])
    r = httpx.post(srv.base + "/lora-adapters", params={"model": "smollm2"}, json=[{"id": 0, "scale": 1}])
    assert r.status_code == 200, r.text
    assert chat(srv, "smollm2", QUESTIONS[0]) == tuned
    original = srv.config_path.read_text()
    cfg = yaml.safe_load(original)
    cfg["models"][0]["lora"][0]["scale"] = 0
    try:
        srv.config_path.write_text(yaml.safe_dump(cfg))
        r = httpx.post(srv.base + "/v1/admin/config/reload", timeout=60)
        assert r.status_code == 200 and r.json()["applied"] == ["models.smollm2.lora[0].scale"], r.text
        assert r.json()["restart_required"] == []
        assert chat(srv, "smollm2-tuned", QUESTIONS[0]) == chat(srv, "smollm2", QUESTIONS[0]) != tuned
        for name in ("smollm2", "smollm2-tuned"):
            listed = httpx.get(srv.base + "/lora-adapters", params={"model": name}).json()
            assert [a["scale"] for a in listed] == [0], name
    finally:
        srv.config_path.write_text(original)
        assert httpx.post(srv.base + "/v1/admin/config/reload", timeout=60).status_code == 200
    assert chat(srv, "smollm2-tuned", QUESTIONS[0]) == tuned
