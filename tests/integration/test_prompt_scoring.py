"""Scoring prompts through /v1/completions: `echo` with `logprobs` gives each prompt token's
log-probability after the tokens before it, as lm-evaluation-harness's `local-completions` asks
for it (token-id prompts in a batch, max_tokens 1 or 0, top-1 alternatives to tell a greedy
continuation). Checked against the server's own generation: a greedy answer scored as a prompt
has the log-probabilities it was generated with, and each of its tokens is the top alternative.

SmolLM2 runs with speculation (scored chunks of up to 63 rows); Gemma 3 without it, where its
context keeps two logits rows and a scored prompt is prefilled two tokens at a time."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import llama_cpp
import pytest

from conftest import GEMMA3, SMOLLM2, model_entry
from opshelp import metric

MODELS = {"smollm2-135m": SMOLLM2, "gemma3-270m": GEMMA3}
STORY = ("The lighthouse keeper climbed the stairs every evening at dusk. " * 3
         + "He counted the ships: one from the north, two from the east, and three from the south. ")


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory(
        {
            "models": [
                model_entry("smollm2-135m", SMOLLM2, n_parallel=4, speculative={"sources": ["ngram"]}),
                model_entry("gemma3-270m", GEMMA3, n_parallel=2),
            ],
        },
        "scoring",
    )


def post(server, body: dict, path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(server.base + path, json=body, timeout=300)


def complete(server, **body) -> dict:
    r = post(server, {"temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def token_ids(model: str, text: str, bos: bool) -> list[int]:
    vocab = llama_cpp.Llama(model_path=str(MODELS[model]), vocab_only=True, verbose=False)
    return vocab.tokenize(text.encode(), add_bos=bos, special=False)


@pytest.mark.parametrize("model", list(MODELS))
def test_a_greedy_answer_scored_as_a_prompt_has_the_logprobs_it_was_generated_with(server, model):
    prompt = STORY + "Count the ships again:"
    gen = complete(server, model=model, prompt=prompt, max_tokens=40, logprobs=1)["choices"][0]
    full = prompt + gen["text"]
    scored = complete(server, model=model, prompt=full, max_tokens=0, echo=True, logprobs=1)
    choice = scored["choices"][0]
    assert choice["text"] == full and choice["finish_reason"] == "length"
    assert scored["usage"]["completion_tokens"] == 0
    lp = choice["logprobs"]
    n_prompt = scored["usage"]["prompt_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n_prompt > 60
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert "".join(lp["tokens"]) == full  # Gemma's BOS reads as ""
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(n_prompt)]
    n = len(gen["logprobs"]["tokens"])
    assert lp["tokens"][-n:] == gen["logprobs"]["tokens"]
    # the prefill computes what decoding computed (batch-invariant kernels), so the same numbers
    assert lp["token_logprobs"][-n:] == pytest.approx(gen["logprobs"]["token_logprobs"], abs=1e-3)
    for value, top in zip(lp["token_logprobs"][-n:], lp["top_logprobs"][-n:]):
        assert value == max(top.values())  # greedy: each answer token is the top-1 alternative
    assert all(v <= 0 for v in lp["token_logprobs"][1:])
    # the story's repeated sentence is easier the second time
    sentence = len(token_ids(model, STORY[: len(STORY) // 4 - 1], False))
    first = sum(lp["token_logprobs"][2 : sentence])
    second = sum(lp["token_logprobs"][sentence + 2 : 2 * sentence])
    assert second > first + 5, (first, second)


@pytest.mark.parametrize("model", list(MODELS))
def test_token_id_prompts_in_a_batch_score_as_their_text_does_and_a_cached_prefix_is_not_restored(server, model):
    """The harness's request: token-id prompts, max_tokens 1, logprobs 1, echo. The first prompt
    was just run plainly (its prefix saved in the cache): scoring it still computes every position."""
    bos = model == "gemma3-270m"  # Gemma's tokenizer adds BOS to a text prompt; ids are taken as they are
    texts = ["The capital of France is Paris", "The capital of France is London"]
    complete(server, model=model, prompt=texts[0], max_tokens=4)
    ids = [token_ids(model, t, bos) for t in texts]
    batch = complete(server, model=model, prompt=ids, max_tokens=1, logprobs=1, echo=True)
    by_text = complete(server, model=model, prompt=texts, max_tokens=1, logprobs=1, echo=True)
    assert [c["index"] for c in batch["choices"]] == [0, 1]
    for c, t, text_c, p in zip(batch["choices"], texts, by_text["choices"], ids):
        assert c["text"].startswith(t) and text_c["text"].startswith(t)
        lp = c["logprobs"]["token_logprobs"]
        assert len(lp) == len(p) + 1 and lp[0] is None  # the prompt, then the one generated token
        assert lp == text_c["logprobs"]["token_logprobs"]
    ctx = len(token_ids(model, "The capital of France is", bos))
    paris, london = (sum(c["logprobs"]["token_logprobs"][ctx:-1]) for c in batch["choices"])
    assert paris > london


def test_streamed_and_fanned_out_echo_carries_the_same_scores(server):
    body = {"model": "smollm2-135m", "prompt": "One, two, three, four,", "max_tokens": 3, "logprobs": 2,
            "echo": True}
    scored = lambda: metric(httpx.get(server.base + "/metrics").text, "eie_prompt_scored_tokens_total",  # noqa: E731
                            model="smollm2-135m")
    before = scored()
    whole = complete(server, **body, n=2)
    assert whole["choices"][0]["logprobs"] == whole["choices"][1]["logprobs"]
    n_prompt = whole["usage"]["prompt_tokens"]  # the prompt once for its two choices
    assert scored() - before == n_prompt  # one scored prefill, which the second choice copies
    alone = complete(server, **body)["choices"][0]["logprobs"]
    assert alone["token_logprobs"][:n_prompt] == whole["choices"][1]["logprobs"]["token_logprobs"][:n_prompt]
    # streamed, each choice's echo chunk carries the scores
    with httpx.stream("POST", server.base + "/v1/completions", json={**body, "temperature": 0, "stream": True, "n": 2},
                      timeout=120) as r:
        fanned = [json.loads(ln[6:])["choices"][0] for ln in r.iter_lines() if ln.startswith("data: {")]
    echoes = {c["index"]: c["logprobs"]["token_logprobs"] for c in fanned if c["text"] == body["prompt"]}
    assert echoes == {0: alone["token_logprobs"][:n_prompt], 1: alone["token_logprobs"][:n_prompt]}
    with httpx.stream("POST", server.base + "/v1/completions", json={**body, "temperature": 0, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200
        lines = [ln[6:] for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    chunks = [json.loads(ln)["choices"][0] for ln in lines[:-1]]
    echoed = chunks[0]
    assert echoed["text"] == body["prompt"]
    n_prompt = len(echoed["logprobs"]["tokens"])
    assert echoed["logprobs"]["token_logprobs"] == whole["choices"][0]["logprobs"]["token_logprobs"][:n_prompt]
    assert "".join(c["text"] for c in chunks) == whole["choices"][0]["text"]
    assert len(echoed["logprobs"]["top_logprobs"][1]) == 2
    # echo without logprobs: the prompt's text first, nothing scored
    plain = complete(server, model="gemma3-270m", prompt="Hello there", max_tokens=0, echo=True)
    assert plain["choices"][0]["text"] == "Hello there" and plain["choices"][0]["logprobs"] is None


def test_scoring_beside_other_requests_changes_none_of_their_answers(server):
    asks = [{"model": "gemma3-270m", "prompt": f"List {k} colours:", "max_tokens": 24} for k in (3, 4)]
    alone = [complete(server, **a)["choices"][0]["text"] for a in asks]
    score = {"model": "gemma3-270m", "prompt": STORY * 2, "max_tokens": 0, "echo": True, "logprobs": 1}
    before = metric(httpx.get(server.base + "/metrics").text, "eie_prompt_scored_tokens_total", model="gemma3-270m")
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        scored = pool.submit(complete, server, **score)
        together = [pool.submit(complete, server, **a) for a in asks]
        assert [f.result()["choices"][0]["text"] for f in together] == alone
        n_prompt = scored.result()["usage"]["prompt_tokens"]
    after = metric(httpx.get(server.base + "/metrics").text, "eie_prompt_scored_tokens_total", model="gemma3-270m")
    assert after - before == n_prompt


@pytest.mark.parametrize("body, param", [
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": [[1, 2], []], "echo": True}, "prompt[1]"),
    ({"prompt": [[1, 2], [10**9]], "echo": True}, "prompt[1]"),
    ({"prompt": [[1, 2], "x"], "echo": True}, "prompt"),
    ({"prompt": [[1]] * 17, "echo": True}, "prompt"),
    ({"prompt": "hi", "echo": True, "logprobs": 6}, "logprobs"),
])
def test_bad_scoring_requests_name_the_field(server, body, param):
    r = post(server, {"model": "smollm2-135m", **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
