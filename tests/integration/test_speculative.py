"""Speculative decoding through the real server: greedy answers identical with and without it
(both models, several prompts, concurrent streams), the history index across a restart, a draft
model made from the target (a layer-truncated copy), the controller turning speculation off
where drafts do not pay, a draft model with another vocabulary, and the request field."""

from __future__ import annotations

import concurrent.futures
import json
import time
from pathlib import Path

import httpx
import pytest

from appliance.engine.prefix import file_sha256
from appliance.engine.speculative.make_draft import truncate_layers
from conftest import GEMMA3, SMOLLM2, model_entry

TEXT = ("Teh old lighthouse stood on the edge of the clif, its whte paint peeling in the salty wind. Every "
        "evening the keeper climed the narow stairs to light the lamp, and every morning he wrote in his "
        "log what ships had pased in the night.")
PROMPTS = {
    "rewrite": f"Correct the spelling mistakes and write the text out again in full:\n\n{TEXT}",
    "json": "Extract the invoice as JSON with keys number, date, customer, total:\n\nInvoice number 4471, "
            "dated 3 March 2024, was issued to Harbor Supplies Ltd for a total of 1,250.00 EUR.",
    "story": "Write a short story about a fox who finds a lost key.",
}


def chat(server, model: str, prompt: str, max_tokens: int, **extra) -> str:
    r = httpx.post(server.base + "/v1/chat/completions", timeout=300, json={
        "model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
        "temperature": 0, **extra})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def spec_status(server, model: str) -> dict:
    return httpx.get(server.base + "/v1/admin/scheduling/status").json()["models"][model]["speculative"]


def probed_status(server, model: str) -> dict:
    """The status once the exactness probe has run: a first load leaves it to the runner's first
    step (`exact_verify_kv` is null until then)."""
    deadline = time.monotonic() + 120
    while (status := spec_status(server, model))["exact_verify_kv"] is None and time.monotonic() < deadline:
        time.sleep(0.1)
    return status


@pytest.fixture(scope="module")
def state_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("spec-state")


def spec_config(state_dir: Path) -> dict:
    return {
        "server": {"state_dir": str(state_dir), "cache_dir": str(state_dir)},  # shared by both servers
        "inference": {"speculative": {"sources": ["ngram", "history"]}},
        "models": [model_entry("smollm2-135m", SMOLLM2, n_parallel=4), model_entry("gemma3-270m", GEMMA3, n_parallel=4)],
    }


@pytest.fixture(scope="module")
def spec_server(server_factory, state_dir):
    return server_factory(spec_config(state_dir), "spec")


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_greedy_answers_are_identical_with_and_without_speculation(spec_server, model):
    for name, prompt in PROMPTS.items():
        plain = chat(spec_server, model, prompt, 96, speculative=False)
        fast = chat(spec_server, model, prompt, 96)
        assert fast == plain, name
    stats = spec_status(spec_server, model)
    assert stats["drafted"] > 0 and 0 < stats["accepted"] <= stats["drafted"], stats
    assert stats["acceptance_rate"] == round(stats["accepted"] / stats["drafted"], 4)
    assert stats["ngram_accepted"] > 0 and isinstance(stats["controller_on"], bool)


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_the_argmax_of_plain_greedy_requests_is_the_greedy_samplers_token(spec_server, model):
    """Plain greedy requests take numpy's argmax of each logits row (runner.py); a zero logit bias
    changes no logit but sends the request through llama.cpp's sampler chain instead."""
    for name, prompt in PROMPTS.items():
        for speculative in (False, True):  # one row per step, and verifications of several rows
            chain = chat(spec_server, model, prompt, 64, speculative=speculative, logit_bias={"0": 0})
            assert chat(spec_server, model, prompt, 64, speculative=speculative) == chain, (name, speculative)


@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_concurrent_speculating_streams_give_the_solo_answers(spec_server, model):
    # four sequences verifying up to 17 rows each would pass the 64 rows where Gemma's K-quant
    # kernel changes its order of sums: the runner keeps such a step under it
    prompts = [*PROMPTS.values(), PROMPTS["rewrite"]]
    solo = {p: chat(spec_server, model, p, 64, speculative=False) for p in PROMPTS.values()}
    before = spec_status(spec_server, model)["drafted"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda p: chat(spec_server, model, p, 64), prompts))
    assert answers == [solo[p] for p in prompts]
    assert spec_status(spec_server, model)["drafted"] > before


def test_a_verified_steps_tokens_stream_as_one_chunk(spec_server):
    # a verification emits up to 17 tokens: they leave as one event, not one each (each costs the
    # event loop CPU time on the cores the next decode runs on)
    prompt = PROMPTS["rewrite"]
    plain = chat(spec_server, "smollm2-135m", prompt, 96, speculative=False)
    chat(spec_server, "smollm2-135m", prompt, 96)  # the history holds the answer now: long drafts
    body = {"model": "smollm2-135m", "messages": [{"role": "user", "content": prompt}], "max_tokens": 96,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    chunks, usage = [], None
    with httpx.stream("POST", spec_server.base + "/v1/chat/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                event = json.loads(line[6:])
                usage = event.get("usage") or usage
                chunks += [c["delta"]["content"] for c in event["choices"] if c["delta"].get("content")]
    assert "".join(chunks) == plain
    assert len(chunks) <= usage["completion_tokens"] // 3, (len(chunks), usage)


def test_turbo_kv_verifies_exactly_across_attention_chunks(server_factory):
    # TurboQuant flash attention splits a decode's cells into chunks of 256: a prompt of ~400
    # tokens spans two, and verifying drafts must still compute what decoding alone does
    srv = server_factory({"models": [model_entry("m", SMOLLM2, n_parallel=2, kv_cache={"mode": "turbo3"},
                                                 speculative={"sources": ["ngram"]})]}, "spec-turbo")
    assert probed_status(srv, "m")["exact_verify_rows"] == 17  # every probed width is exact
    prompt = f"Correct the spelling mistakes and write the text out again in full:\n\n{TEXT} {TEXT} {TEXT}"
    plain = chat(srv, "m", prompt, 96, speculative=False)
    assert chat(srv, "m", prompt, 96) == plain
    assert spec_status(srv, "m")["accepted"] > 0
    srv.stop()


def test_a_first_boot_probes_at_the_first_step_and_a_restart_reads_the_answer_at_load(server_factory, tmp_path):
    """The probe takes 1-4 s on 2 cores: a first boot leaves it to the runner's first step, so
    the model is ready sooner; its answer is kept in the cache dir, and a restart has it at load."""
    config = {"server": {"cache_dir": str(tmp_path / "cache")},
              "models": [model_entry("m", SMOLLM2, n_parallel=2, speculative={"sources": ["ngram"]})]}
    srv = server_factory(config, "spec-first-boot")
    first = probed_status(srv, "m")
    assert first["exact_verify_rows"] == 17 and first["exact_verify_kv"] is not None
    assert len(list((tmp_path / "cache" / "exact-verify-rows").iterdir())) == 1
    srv.stop()
    srv = server_factory(config, "spec-restart")
    assert spec_status(srv, "m")["exact_verify_kv"] == first["exact_verify_kv"]  # at once, from the cache
    assert "exact up to 17 tokens" in srv.log()
    srv.stop()


def test_a_kv_type_change_measures_exact_verification_again(server_factory, tmp_path):
    # other KV types take other attention kernels: greedy sequences verify no drafts until the
    # probe has run for the new types, on a free sequence, at the next step (a cache dir of its
    # own, where no server has measured them)
    srv = server_factory({"server": {"cache_dir": str(tmp_path / "cache")}, "models": [model_entry("m", SMOLLM2, n_parallel=2, speculative={"sources": ["ngram"]})]},
                         "spec-kv-change")
    before = probed_status(srv, "m")
    assert before["exact_verify_rows"] == 17 and before["exact_verify_kv"] not in (None, ["q8_0", "q8_0"])
    r = httpx.post(srv.base + "/v1/admin/kv/convert", json={"model": "m", "mode": "q8_0"}, timeout=120)
    assert r.status_code == 200, r.text
    prompt = PROMPTS["rewrite"]
    plain = chat(srv, "m", prompt, 96, speculative=False)
    after = spec_status(srv, "m")
    assert after["exact_verify_kv"] == ["q8_0", "q8_0"] and 1 <= after["exact_verify_rows"] <= 17, after
    assert chat(srv, "m", prompt, 96) == plain
    srv.stop()


def test_sampled_requests_speculate_through_the_rejection_rule(server_factory):
    # a fresh controller speculates from the first step (other tests may have turned it off here)
    srv = server_factory({"models": [model_entry("m", SMOLLM2, n_parallel=1, speculative={"sources": ["ngram"]})]},
                         "spec-sampled")
    extra = {"temperature": 0.7, "seed": 7, "top_p": 0.95, "repeat_penalty": 1.1}
    # Whether the plan drafts at all depends on the step costs it measures, and the drawn text on
    # the drafts: a few seeds, so that the assertion does not hang on one draw.
    for seed in (7, 8, 9, 10):
        assert chat(srv, "m", PROMPTS["rewrite"], 64, **{**extra, "seed": seed})
        stats = spec_status(srv, "m")
        if stats["accepted"] > 0:
            break
    assert stats["drafted"] > 0 and stats["accepted"] > 0, stats
    # without speculation a seed still reproduces its answer (with it, the distribution is the same
    # but which token a draw gives depends on the drafts: tests/unit checks the distribution)
    plain = [chat(srv, "m", PROMPTS["rewrite"], 32, speculative=False, **extra) for _ in range(2)]
    assert plain[0] == plain[1]
    srv.stop()


def test_the_request_field_is_validated(spec_server):
    r = httpx.post(spec_server.base + "/v1/chat/completions", timeout=30, json={
        "model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}], "speculative": "no"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "speculative", r.text


def test_history_drafts_from_earlier_outputs_after_a_restart(spec_server, server_factory, state_dir):
    model = "smollm2-135m"
    answer = chat(spec_server, model, PROMPTS["story"], 48)
    spec_server.stop()  # saves the history next to the KV disk tier
    # one file per model, named after the GGUF's content hash
    assert (state_dir / "kv" / "speculative" / f"{file_sha256(SMOLLM2)[:32]}.history").is_file()
    config = spec_config(state_dir)
    again = server_factory({**config, "models": config["models"][:1]}, "spec-again")
    assert spec_status(again, model)["history_tokens"] > 0
    # the story is not in the prompt: its drafts come from the history of the first run
    assert chat(again, model, PROMPTS["story"], 48) == answer
    assert spec_status(again, model)["history_accepted"] > 0
    again.stop()


@pytest.fixture(scope="module")
def draft_gguf(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("draft") / "smollm2-4-layers.gguf"
    truncate_layers(SMOLLM2, path, 4)
    return path


def test_a_layer_truncated_draft_model_is_exact_and_speculation_stops_where_it_does_not_pay(server_factory, draft_gguf):
    srv = server_factory({"models": [model_entry("m", SMOLLM2, speculative={
        "sources": ["draft_model"], "draft_model": str(draft_gguf)})]}, "spec-draft")
    prompt = "Tell me about the history of the bicycle in a few paragraphs."
    assert chat(srv, "m", prompt, 48) == chat(srv, "m", prompt, 48, speculative=False)
    chat(srv, "m", PROMPTS["story"], 112)  # no repetition: 4 of 30 layers draft poorly
    stats = spec_status(srv, "m")
    assert stats["draft_model_drafted"] > 0 and stats["acceptance_rate"] < 0.3, stats
    # the planner declines drafts that do not pay (the controller would switch off what it misses)
    assert stats["declined"] > 0 or not stats["controller_on"], stats
    assert stats["plain_steps"] > 3 * stats["spec_steps"], stats
    # the draft model's memory is the model's too: measured, estimated before the load, in the total
    entry = next(m for m in httpx.get(srv.base + "/v1/admin/vram/status").json()["models"] if m["name"] == "m")
    measured, est = entry["draft_model_bytes"], entry["estimate"]["draft_model_bytes"]
    assert measured > draft_gguf.stat().st_size * 0.9 and abs(est - measured) < 0.15 * measured, entry
    assert entry["total_bytes"] == (entry["weights_bytes"] + entry["kv_cache_bytes"] + entry["compute_bytes"]
                                    + measured), entry
    assert entry["estimate"]["total_bytes"] > entry["estimate"]["weights_bytes"] + est, entry
    srv.stop()


def test_a_draft_model_with_another_vocabulary_fails_the_load_naming_the_key(server_factory):
    srv = server_factory({"models": [model_entry("m", SMOLLM2, speculative={
        "sources": ["ngram", "draft_model"], "draft_model": str(GEMMA3)})]}, "spec-vocab")
    health = httpx.get(srv.base + "/health").json()
    assert health["status"] == "degraded"
    error = health["models"]["m"]["error"]
    assert "models[0].speculative.draft_model" in error and "vocabulary" in error and "262144" in error, error
    srv.stop()


def test_names_on_one_file_measure_exact_verification_once(server_factory):
    """Four names on SmolLM2 load together (its other facts are known in this run): the first
    to step measures, the others wait for its answer (a draft length no other test uses, so that
    no answer is kept yet)."""
    spec = {"sources": ["ngram"], "max_draft": 6}
    srv = server_factory({"models": [model_entry(f"m{i}", SMOLLM2, n_parallel=1, speculative=spec)
                                     for i in range(4)]}, "spec-one-probe")
    statuses = [probed_status(srv, f"m{i}") for i in range(4)]
    assert all(s["exact_verify_rows"] == statuses[0]["exact_verify_rows"] for s in statuses), statuses
    assert srv.log().count("tokens per sequence (measured in") == 1, srv.log()
