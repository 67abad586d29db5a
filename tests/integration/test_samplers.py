"""llama-server's further samplers through the real server (engine/sampling.py build_chain): DRY,
top-n-sigma, typical, XTC, dynamic temperature, mirostat 1 and 2, repeat_last_n; on chat and
through the Responses, Messages and Ollama adapters. Where a sampler's effect can be pinned down
it is: a DRY penalty ends a greedy loop, a tiny top-n-sigma or mirostat target leaves only the
likeliest token (the greedy answer at any temperature), with and without speculative decoding."""

from __future__ import annotations

import anthropic
import httpx
import ollama
import openai
import pytest

from conftest import SMOLLM2, model_entry

LOOP = [{"role": "user", "content": "List the days of the week, over and over."}]
ASK = [{"role": "user", "content": "Write two sentences about the sea."}]


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory({
        "models": [model_entry("spec", SMOLLM2, speculative={"sources": ["ngram", "history"]}),
                   model_entry("plain", SMOLLM2)],
    }, "samplers")


def chat(server, model: str = "plain", messages=ASK, max_tokens: int = 60, **kw) -> str:
    r = httpx.post(server.base + "/v1/chat/completions", timeout=300, json={
        "model": model, "messages": messages, "max_tokens": max_tokens, **kw})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


@pytest.mark.parametrize("model", ["plain", "spec"])
def test_dry_ends_a_greedy_loop(server, model):
    looping = chat(server, model, LOOP, 120, temperature=0)
    assert looping.count("Sunday") > 20
    dry = chat(server, model, LOOP, 120, temperature=0, dry_multiplier=0.8, dry_sequence_breakers=[])
    assert dry.count("Sunday") < 8 and dry.startswith(looping[:40])
    # the default breakers ("\n" among them) cut every repeat of "Sunday\n" short: no penalty
    assert chat(server, model, LOOP, 120, temperature=0, dry_multiplier=0.8) == looping


@pytest.mark.parametrize("model", ["plain", "spec"])
@pytest.mark.parametrize("sampler", [{"top_n_sigma": 0.001}, {"mirostat": 2, "mirostat_tau": 0.01},
                                     {"mirostat": 1, "mirostat_tau": 0.01}])
def test_a_sampler_that_keeps_only_the_top_token_answers_greedily(server, model, sampler):
    greedy = chat(server, model, temperature=0)
    assert chat(server, model, temperature=1.5, seed=3, **sampler) == greedy


@pytest.mark.parametrize("sampler", [{"typical_p": 0.2}, {"xtc_probability": 1.0, "xtc_threshold": 0.05},
                                     {"dynatemp_range": 0.5, "dynatemp_exponent": 2.0},
                                     {"mirostat": 2, "mirostat_tau": 3.0}])
def test_seeded_samplers_are_reproducible_and_change_the_draw(server, sampler):
    plain = chat(server, temperature=0.8, seed=5)
    first = chat(server, temperature=0.8, seed=5, **sampler)
    assert chat(server, temperature=0.8, seed=5, **sampler) == first
    assert first != plain


def test_sampled_speculation_runs_with_the_samplers(server):
    for sampler in ({"typical_p": 0.5, "dry_multiplier": 0.5}, {"mirostat": 2}, {"xtc_probability": 0.5}):
        r = httpx.post(server.base + "/v1/chat/completions", timeout=300, json={
            "model": "spec", "messages": LOOP, "max_tokens": 60, "temperature": 0.7, "seed": 1, **sampler})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text


def test_a_seeded_ollama_request_repeats_on_a_speculating_model(server):
    """Ollama promises that a seed repeats an answer; a speculating draw depends on the drafts, so
    a seeded sampled Ollama request does not speculate unless it says `speculative: true`: its
    answer is the chat route's with `speculative: false` (the same sampling, Ollama's defaults),
    every time. Before, it speculated and changed from call to call."""
    options = {"num_predict": 40, "seed": 7}
    expected = chat(server, "spec", ASK, 40, seed=7, temperature=0.8, top_k=40, top_p=0.9, speculative=False)
    client = ollama.Client(host=server.base, timeout=300)
    for _ in range(3):
        assert client.chat(model="spec", messages=ASK, options=options).message.content == expected
    r = httpx.post(server.base + "/api/chat", timeout=300, json={
        "model": "spec", "messages": ASK, "options": options, "stream": False, "speculative": True})
    assert r.status_code == 200 and r.json()["message"]["content"], r.text


def test_repeat_last_n_bounds_the_penalties(server):
    free = chat(server, messages=LOOP, max_tokens=80, temperature=0)
    assert chat(server, messages=LOOP, max_tokens=80, temperature=0, repeat_penalty=1.5, repeat_last_n=0) == free
    assert chat(server, messages=LOOP, max_tokens=80, temperature=0, repeat_penalty=1.5) != free
    whole = chat(server, messages=LOOP, max_tokens=80, temperature=0, repeat_penalty=1.5, repeat_last_n=-1)
    assert whole != free


@pytest.mark.parametrize("body,param", [
    ({"mirostat": 3}, "mirostat"), ({"typical_p": 1.5}, "typical_p"), ({"dry_base": 0.5}, "dry_base"),
    ({"dry_sequence_breakers": [""]}, "dry_sequence_breakers[0]"), ({"repeat_last_n": -2}, "repeat_last_n"),
    ({"top_n_sigma": -3}, "top_n_sigma"), ({"xtc_threshold": "high"}, "xtc_threshold"),
])
def test_bad_sampler_fields_are_refused_by_name(server, body, param):
    r = httpx.post(server.base + "/v1/chat/completions", timeout=60, json={"model": "plain", "messages": ASK, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_the_other_apis_hand_the_samplers_on(server):
    greedy = chat(server, max_tokens=24, temperature=0)
    responses = openai.OpenAI(base_url=server.base + "/v1", api_key="none")
    r = responses.responses.create(model="plain", input=ASK, max_output_tokens=24, temperature=1.5,
                                   extra_body={"top_n_sigma": 0.001, "seed": 3})
    assert r.output_text == greedy
    messages = anthropic.Anthropic(base_url=server.base, api_key="none")
    m = messages.messages.create(model="plain", max_tokens=24, messages=ASK,
                                 extra_body={"temperature": 1.5, "mirostat": 2, "mirostat_tau": 0.01, "seed": 3})
    assert m.content[0].text == greedy
    client = ollama.Client(host=server.base, timeout=300)
    o = client.chat(model="plain", messages=ASK, options={"temperature": 1.5, "mirostat": 2, "mirostat_tau": 0.01,
                                                          "num_predict": 24, "seed": 3})
    assert o.message.content == greedy
    typical = client.chat(model="plain", messages=ASK, options={"temperature": 0.8, "typical_p": 0.2, "seed": 5,
                                                                "num_predict": 60, "top_k": 0, "top_p": 1.0})
    assert typical.message.content == chat(server, temperature=0.8, seed=5, typical_p=0.2)


def test_best_of_returns_the_candidates_with_the_highest_mean_logprob(server):
    """best_of: that many seeded candidates per prompt, the n with the highest mean token
    log-probability back, best first; usage counts every candidate. The same candidates asked as
    n=5 with logprobs say which are best."""
    body = {"model": "plain", "prompt": "The sea is", "max_tokens": 12, "temperature": 1.0, "seed": 7}
    best = httpx.post(server.base + "/v1/completions", timeout=300, json={**body, "n": 2, "best_of": 5}).json()
    every = httpx.post(server.base + "/v1/completions", timeout=300, json={**body, "n": 5, "logprobs": 0}).json()
    means = sorted(((sum(c["logprobs"]["token_logprobs"]) / len(c["logprobs"]["token_logprobs"]), c["text"])
                    for c in every["choices"]), reverse=True)
    assert len({text for _, text in means}) > 2  # the candidates differ: the choice means something
    assert [c["text"] for c in best["choices"]] == [text for _, text in means[:2]]
    assert [c["index"] for c in best["choices"]] == [0, 1]
    assert best["usage"]["completion_tokens"] == every["usage"]["completion_tokens"]
    assert best["usage"]["prompt_tokens"] == every["usage"]["prompt_tokens"] == 3  # the prompt once, not 5 times
    for change, param in (({"n": 3, "best_of": 2}, "best_of"), ({"best_of": 3, "stream": True}, "best_of"),
                          ({"best_of": 17}, "best_of")):
        r = httpx.post(server.base + "/v1/completions", timeout=60, json={**body, **change})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
