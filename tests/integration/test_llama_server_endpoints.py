"""Fill-in-the-middle (api/infill.py: OpenAI completions' `suffix`, Ollama's, llama-server's
/infill) and llama-server's /completion (api/llama_server_routes.py), through the real server, on
a SmolLM2 copy whose vocabulary has FIM tokens (Granite's names for the prefix, suffix and middle,
Qwen's file separator; SmolLM2's own `<reponame>` is the repository token llama.cpp finds). The
model was never trained on them: the tests check the prompt's layout (each answer is the plain
completion of the prompt written out by hand) and the API shapes, not the code written."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import SMOLLM2, model_entry
from retokened_smollm2 import CONTROL, retokened_smollm2

FIM = {5: "<|file_sep|>", 14: "<fim_prefix>", 15: "<fim_suffix>", 16: "<fim_middle>"}
PREFIX = "def add(a, b):\n    "
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def server(server_factory, tmp_path_factory):
    fim = retokened_smollm2(tmp_path_factory.mktemp("fim") / "smollm2-fim.gguf", FIM, CONTROL)
    return server_factory({"models": [model_entry("coder", fim, n_parallel=2),
                                      model_entry("plain", SMOLLM2, n_parallel=1)]}, "infill")


def written_out(server, *parts: str) -> list[int]:
    """The prompt written out by hand: each part tokenized on its own (special tokens named in
    it), as the server tokenizes the prefix, the typed text, the suffix and each file apart."""
    out = []
    for part in parts:
        r = httpx.post(server.base + "/tokenize", timeout=60, json={
            "model": "coder", "content": part, "parse_special": True, "add_special": False})
        assert r.status_code == 200, r.text
        out += [t if isinstance(t, int) else t["id"] for t in r.json()["tokens"]]
    return out


def completion(server, **body) -> dict:
    r = httpx.post(server.base + "/v1/completions", timeout=300, json={
        "model": "coder", "temperature": 0, "max_tokens": 12, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_a_suffix_fills_the_gap_in_the_repository_layout(server):
    got = completion(server, prompt=PREFIX, suffix=SUFFIX)
    layout = written_out(server, "<reponame>myproject\n<|file_sep|>filename\n<fim_prefix>", PREFIX,
                         "<fim_suffix>", SUFFIX, "<fim_middle>")
    assert got["usage"]["prompt_tokens"] == len(layout)
    plain = completion(server, prompt=layout)
    assert got["choices"][0]["text"] == plain["choices"][0]["text"]


def test_infill_answers_in_llama_servers_shape_whole_and_streamed(server):
    body = {"model": "coder", "input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 12, "temperature": 0,
            "input_extra": [{"filename": "util.py", "text": "def sub(a, b):\n    return a - b\n"}],
            "prompt": "return"}
    r = httpx.post(server.base + "/infill", timeout=300, json=body)
    assert r.status_code == 200, r.text
    whole = r.json()
    layout = written_out(server, "<reponame>myproject\n<|file_sep|>util.py\n", "def sub(a, b):\n    return a - b\n",
                         "<|file_sep|>filename\n<fim_prefix>", PREFIX, "return", "<fim_suffix>", SUFFIX, "<fim_middle>")
    assert whole["tokens_evaluated"] == len(layout) and whole["truncated"] is False
    assert whole["content"] == completion(server, prompt=layout)["choices"][0]["text"]
    assert whole["stop"] is True and whole["stop_type"] in ("eos", "limit") and whole["model"] == "coder"
    assert whole["tokens_predicted"] <= 12 and whole["timings"]["predicted_n"] == whole["tokens_predicted"]
    events = []
    with httpx.stream("POST", server.base + "/infill", timeout=300, json={**body, "stream": True}) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["stop_type"] == whole["stop_type"]
    counts = [e["tokens_predicted"] for e in events]  # tokens so far, not pieces of text
    assert counts == sorted(counts) and counts[-1] == whole["tokens_predicted"]
    assert counts[-1] - counts[-2] <= 1  # the end of generation may be one token without text


def test_a_long_prefix_is_cut_to_fit_the_context_and_says_so(server):
    r = httpx.post(server.base + "/infill", timeout=300, json={
        "model": "coder", "input_prefix": "x = 1\n" * 1500, "input_suffix": SUFFIX, "n_predict": 8})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["truncated"] is True and out["tokens_evaluated"] + 8 <= 2048


def test_ollamas_generate_with_a_suffix_fills_the_same_gap(server):
    r = httpx.post(server.base + "/api/generate", timeout=300, json={
        "model": "coder", "prompt": PREFIX, "suffix": SUFFIX, "stream": False,
        "options": {"temperature": 0, "num_predict": 12}})
    assert r.status_code == 200, r.text
    assert r.json()["response"] == completion(server, prompt=PREFIX, suffix=SUFFIX)["choices"][0]["text"]


def test_completion_answers_in_llama_servers_shape(server):
    prompt = "The capital of France is"
    expected = completion(server, prompt=prompt)
    r = httpx.post(server.base + "/completion", timeout=300, json={
        "model": "coder", "prompt": prompt, "n_predict": 12, "temperature": 0})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["content"] == expected["choices"][0]["text"] and out["stop"] is True
    assert out["tokens_evaluated"] == expected["usage"]["prompt_tokens"]
    assert out["stop_type"] == ("limit" if expected["choices"][0]["finish_reason"] == "length" else "eos")
    ids = written_out(server, prompt)
    by_ids = httpx.post(server.base + "/completion", timeout=300, json={
        "model": "coder", "prompt": ids, "n_predict": 12, "temperature": 0, "stream": True})
    events = [json.loads(line[6:]) for line in by_ids.text.splitlines() if line.startswith("data: ")]
    assert "".join(e["content"] for e in events) == out["content"] and events[-1]["stop"] is True
    stopped = httpx.post(server.base + "/completion", timeout=300, json={
        "model": "coder", "prompt": prompt, "n_predict": 12, "temperature": 0,
        "stop": [out["content"][2:6]]}).json()
    assert stopped["stop_type"] == "word" and stopped["stopping_word"] == out["content"][2:6]
    # a stop string in the first token's text: no text ever comes out, and the timings still split
    # the prompt's prefill from the token's generation (they were 0 ms and 1e9 tokens/s)
    eaten = httpx.post(server.base + "/completion", timeout=300, json={
        "model": "coder", "prompt": prompt, "n_predict": 12, "temperature": 0, "stop": [out["content"][:2]]}).json()
    assert eaten["content"] == "" and eaten["stop_type"] == "word" and eaten["tokens_predicted"] == 1
    timings = eaten["timings"]
    assert timings["predicted_ms"] > 0 and timings["prompt_ms"] > 0
    assert timings["predicted_per_second"] == pytest.approx(1000 / timings["predicted_ms"])


def test_an_n_predict_past_the_context_generates_up_to_its_end(server):
    # as llama-server does (code editors' plugins send a fixed large n_predict); it was a 400
    n_ctx = httpx.get(server.base + "/props", params={"model": "coder"}, timeout=60).json()[
        "default_generation_settings"]["n_ctx"]
    prompt = written_out(server, "one two three four ") * ((n_ctx - 6) // 4)
    prompt = prompt[:n_ctx - 6]
    for path, body in (("/completion", {"prompt": prompt}), ("/infill", {"input_prefix": "def f():", "input_suffix": ""})):
        r = httpx.post(server.base + path, timeout=300, json={"model": "coder", "n_predict": 100000, "temperature": 0,
                                                              **body})
        assert r.status_code == 200, r.text
        out = r.json()
        assert out["stop_type"] in ("limit", "eos")
        if path == "/completion":
            assert out["tokens_predicted"] <= 6 and out["tokens_evaluated"] == n_ctx - 6


def test_ignore_eos_runs_the_answer_to_n_predict(server):
    chat = "<|im_start|>user\nSay hi<|im_end|>\n<|im_start|>assistant\n"
    ask = {"model": "plain", "prompt": chat, "n_predict": 40, "temperature": 0}
    ends = httpx.post(server.base + "/completion", timeout=300, json=ask).json()
    assert ends["stop_type"] == "eos" and ends["tokens_predicted"] < 40  # (the test needs an answer that ends)
    runs = httpx.post(server.base + "/completion", timeout=300, json={**ask, "ignore_eos": True}).json()
    assert runs["stop_type"] == "limit" and runs["tokens_predicted"] == 40
    assert runs["content"].startswith(ends["content"])


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/completion", {"model": "coder", "prompt": "a", "n_probs": 2}, "n_probs"),
    ("/completion", {"model": "coder", "prompt": "a", "return_tokens": True}, "return_tokens"),
    ("/infill", {"model": "plain", "input_prefix": "a", "input_suffix": "b"}, "input_suffix"),
    ("/v1/completions", {"model": "plain", "prompt": "a", "suffix": "b"}, "suffix"),
    ("/v1/completions", {"model": "coder", "prompt": "a", "suffix": "b", "echo": True}, "echo"),
    ("/v1/completions", {"model": "coder", "prompt": [1, 2], "suffix": "b"}, "prompt"),
    ("/infill", {"model": "coder", "input_prefix": "a", "input_suffix": "b", "n": 2}, "n"),
    ("/infill", {"model": "coder", "input_prefix": "a"}, "input_suffix"),
    ("/completion", {"model": "coder", "prompt": [999999]}, "prompt"),
])
def test_what_cannot_be_filled_is_a_400_naming_the_field(server, path, body, param):
    r = httpx.post(server.base + path, timeout=60, json=body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_props_describe_a_model_and_without_one_the_router(server):
    router = httpx.get(server.base + "/props", timeout=60).json()
    assert router["role"] == "router" and router["models"] == ["coder", "plain"]
    assert router["default_generation_settings"] == {"params": {}, "n_ctx": 0}  # what llama-server's router says
    r = httpx.get(server.base + "/props", params={"model": "plain"}, timeout=60)
    assert r.status_code == 200, r.text
    props = r.json()
    assert props["model_alias"] == "plain" and props["total_slots"] == 1
    assert props["model_path"] == str(SMOLLM2) and props["default_generation_settings"]["n_ctx"] == 2048
    params = props["default_generation_settings"]["params"]
    # llama-server's own defaults, which /completion and /infill sample with (its clients send none)
    assert params["n_predict"] == -1 and params["temperature"] == 0.8 and params["top_p"] == 0.95
    assert params["top_k"] == 40 and params["min_p"] == 0.05
    ask = {"model": "plain", "prompt": "Once upon a time", "n_predict": 16, "seed": 7}
    plain = httpx.post(server.base + "/completion", timeout=300, json=ask).json()
    named = httpx.post(server.base + "/completion", timeout=300, json={
        **ask, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}).json()
    assert plain["content"] == named["content"]
    assert "{% for message in messages %}" in props["chat_template"] and props["eos_token"] == "<|im_end|>"
    assert props["modalities"] == {"vision": False, "video": False, "audio": False}
    missing = httpx.get(server.base + "/props", params={"model": "nope"}, timeout=60)
    assert missing.status_code == 404 and missing.json()["error"]["param"] == "model"


def test_apply_template_gives_the_text_the_chat_route_tokenizes(server):
    chat = {"model": "plain", "messages": [{"role": "system", "content": "Be brief."},
                                           {"role": "user", "content": "Hi there"}]}
    r = httpx.post(server.base + "/apply-template", timeout=60, json=chat)
    assert r.status_code == 200, r.text
    prompt = r.json()["prompt"]
    assert prompt == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
                      "<|im_start|>assistant\n")
    tokens = httpx.post(server.base + "/tokenize", timeout=60, json=chat).json()["tokens"]
    assert written_out(server, prompt) == tokens
    bad = httpx.post(server.base + "/apply-template", timeout=60, json={"model": "plain", "messages": "hi"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "messages"
