"""Reasoning models' think blocks (engine/reasoning.py) and chat template variables, through the real
server: SmolLM2 served with templates in the two shapes reasoning models have (Qwen3's: the model
opens `<think>` itself, and `enable_thinking: false` closes an empty block in the prompt;
DeepSeek-R1's: the prompt opens the block), and a SmolLM2 copy given gpt-oss's harmony tokens. A
grammar makes the untrained model write a block."""

from __future__ import annotations

import json

import httpx
import pytest

from conftest import SMOLLM2, model_entry
from reasoning_templates import HARMONY, HARMONY_OPENED, HARMONY_STYLE, HARMONY_TOKENS, OPENED, QWEN3_STYLE, THINK
from retokened_smollm2 import CONTROL, retokened_smollm2

ASK = [{"role": "user", "content": "What is two plus two?"}]


@pytest.fixture(scope="module")
def server(server_factory, tmp_path_factory):
    harmony = retokened_smollm2(tmp_path_factory.mktemp("harmony") / "smollm2-harmony.gguf", HARMONY_TOKENS, CONTROL)
    return server_factory({"models": [
        model_entry("harmony", harmony, n_parallel=1, chat_template=HARMONY_STYLE),
        model_entry("harmony-opened", harmony, n_parallel=1, chat_template=HARMONY_OPENED),
        model_entry("qwen3-style", SMOLLM2, n_parallel=2, chat_template=QWEN3_STYLE),
        model_entry("opened", SMOLLM2, n_parallel=1, chat_template=OPENED),
        model_entry("no-thinking", SMOLLM2, n_parallel=1, chat_template=QWEN3_STYLE,
                    chat_template_kwargs={"enable_thinking": False}),
        model_entry("left-in", SMOLLM2, n_parallel=1, chat_template=QWEN3_STYLE, reasoning_format="none"),
    ], "groups": [
        {"name": "pair", "models": ["qwen3-style", "no-thinking"], "type": "parallel"},
        {"name": "chain", "models": ["opened", "qwen3-style"], "type": "sequential",
         "prompt_templates": [None, "Answer: {input}"]},
    ]}, "reasoning")


def chat(server, model: str, **kw) -> dict:
    r = httpx.post(server.base + "/v1/chat/completions", timeout=300, json={
        "model": model, "messages": ASK, "temperature": 0, "max_tokens": 60, **kw})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def stream(server, model: str, **kw) -> tuple[str, str, str]:
    reasoning = content = ""
    reason = None
    with httpx.stream("POST", server.base + "/v1/chat/completions", timeout=300, json={
            "model": model, "messages": ASK, "temperature": 0, "max_tokens": 60, "stream": True, **kw}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                reasoning += choice["delta"].get("reasoning_content") or ""
                content += choice["delta"].get("content") or ""
                reason = choice["finish_reason"] or reason
    return reasoning, content, reason


def prompt_text(server, model: str, **kw) -> str:
    r = httpx.post(server.base + "/tokenize", timeout=60, json={"model": model, "messages": ASK, "with_pieces": True, **kw})
    assert r.status_code == 200, r.text
    return "".join(t["piece"] for t in r.json()["tokens"])


def test_a_think_block_is_given_apart_whole_and_streamed(server):
    raw = chat(server, "qwen3-style", grammar=THINK, reasoning_format="none")["message"]["content"]
    assert raw.startswith("<think>") and "</think>" in raw
    choice = chat(server, "qwen3-style", grammar=THINK)
    thought, answer = raw[len("<think>"):].split("</think>")
    assert choice["message"]["reasoning_content"] == thought.strip()
    assert choice["message"]["content"] == answer.lstrip() and choice["finish_reason"] == "stop"
    assert stream(server, "qwen3-style", grammar=THINK) == (thought.strip(), answer.lstrip(), "stop")


def test_an_answer_without_a_block_has_no_reasoning(server):
    plain = chat(server, "qwen3-style", max_tokens=20)
    assert "reasoning_content" not in plain["message"] and plain["message"]["content"]


def test_a_block_the_prompt_opened_is_reasoning_until_it_closes(server):
    assert prompt_text(server, "opened").endswith("<|im_start|>assistant\n<think>\n")
    raw = chat(server, "opened", reasoning_format="none", max_tokens=30)["message"]["content"]
    assert "</think>" not in raw  # the untrained model never closes it: cut short, all reasoning
    choice = chat(server, "opened", max_tokens=30)
    assert choice["message"]["reasoning_content"] == raw.strip() and choice["message"]["content"] == ""
    assert choice["finish_reason"] == "length"
    assert stream(server, "opened", max_tokens=30) == (raw.strip(), "", "length")


def test_template_variables_from_the_config_and_the_request(server):
    closed = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    assert prompt_text(server, "no-thinking").endswith(closed)  # models[].chat_template_kwargs
    assert not prompt_text(server, "no-thinking", chat_template_kwargs={"enable_thinking": True}).endswith(closed)
    assert prompt_text(server, "qwen3-style", chat_template_kwargs={"enable_thinking": False}).endswith(closed)
    r = httpx.post(server.base + "/v1/chat/completions", json={
        "model": "no-thinking", "messages": ASK, "max_tokens": 40, "temperature": 0})
    assert r.status_code == 200 and "reasoning_content" not in r.json()["choices"][0]["message"]
    assert r.json()["usage"]["prompt_tokens"] == httpx.post(server.base + "/tokenize", json={
        "model": "no-thinking", "messages": ASK}).json()["count"]


@pytest.mark.parametrize("body,param", [
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs.messages"),
    ({"chat_template_kwargs": {"add_generation_prompt": False}}, "chat_template_kwargs.add_generation_prompt"),
    ({"reasoning_format": "hidden"}, "reasoning_format"),
])
def test_bad_reasoning_fields_are_refused_by_name(server, body, param):
    r = httpx.post(server.base + "/v1/chat/completions", json={"model": "qwen3-style", "messages": ASK, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_group_members_give_their_thinking_apart(server):
    body = {"group": "pair", "messages": ASK, "temperature": 0, "max_tokens": 60, "grammar": THINK}
    r = httpx.post(server.base + "/v1/batch/execute", json=body, timeout=300)
    assert r.status_code == 200, r.text
    members = r.json()["members"]
    for m in members:
        assert m["reasoning_content"] and m["text"] and "<think>" not in m["text"] + m["reasoning_content"], m
    streamed: dict[int, list[str]] = {0: ["", ""], 1: ["", ""]}
    with httpx.stream("POST", server.base + "/v1/batch/execute", json={**body, "stream": True}, timeout=300) as s:
        for line in s.iter_lines():
            if line.startswith("data: {") and (event := json.loads(line[6:]))["type"] == "member.delta":
                streamed[event["index"]][0] += event.get("reasoning_content") or ""
                streamed[event["index"]][1] += event["text"]
    assert streamed == {m["index"]: [m["reasoning_content"], m["text"]] for m in members}


def test_a_chain_passes_on_the_answer_without_the_thinking(server):
    """The first member's block never closes (cut short: all reasoning, no answer), so the next
    member is asked "Answer: " alone; with reasoning_format none it gets the whole text."""
    for fmt in ("auto", "none"):
        r = httpx.post(server.base + "/v1/chain/execute", timeout=300, json={
            "group": "chain", "messages": ASK, "temperature": 0, "max_tokens": 20, "reasoning_format": fmt})
        assert r.status_code == 200, r.text
        first, second = r.json()["members"]
        passed = first["text"]
        if fmt == "auto":
            assert first["reasoning_content"] and passed == ""
        else:
            assert first["reasoning_content"] is None and passed.strip()
        asked = httpx.post(server.base + "/tokenize", json={
            "model": "qwen3-style", "messages": [{"role": "user", "content": "Answer: " + passed}]}).json()["count"]
        assert second["usage"]["prompt_tokens"] == asked


def test_the_model_list_says_which_models_think(server):
    cards = {c["id"]: c for c in httpx.get(server.base + "/v1/models").json()["data"]}
    assert cards["qwen3-style"]["reasoning"] is True and cards["opened"]["reasoning"] is True


def test_a_models_configured_reasoning_format_applies_unless_the_request_says(server):
    raw = chat(server, "left-in", grammar=THINK)["message"]
    assert raw["content"].startswith("<think>") and "reasoning_content" not in raw
    split = chat(server, "left-in", grammar=THINK, reasoning_format="auto")["message"]
    assert split["reasoning_content"] and not split["content"].startswith("<think>")
    assert raw["content"].split("</think>")[0][len("<think>"):].strip() == split["reasoning_content"]


def test_streamed_logprobs_ride_with_text(server):
    """Logprobs of tokens whose text is held back (a tag's start) come with the text that follows,
    never on an empty delta; every token's entry comes once."""
    whole = chat(server, "qwen3-style", grammar=THINK, logprobs=True)
    chunks = []
    with httpx.stream("POST", server.base + "/v1/chat/completions", timeout=300, json={
            "model": "qwen3-style", "messages": ASK, "temperature": 0, "max_tokens": 60, "stream": True,
            "grammar": THINK, "logprobs": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:])["choices"][0])
    entries = []
    for c in chunks:
        if c.get("logprobs") and c["logprobs"]["content"]:
            assert c["delta"].get("content") or c["delta"].get("reasoning_content"), c
            entries += c["logprobs"]["content"]
    assert [e["token"] for e in entries] == [e["token"] for e in whole["logprobs"]["content"]]


def test_group_members_render_with_their_models_template_variables(server):
    """no-thinking's config sets enable_thinking false: its block is closed in the prompt, in a
    group as alone."""
    r = httpx.post(server.base + "/v1/batch/execute", timeout=300, json={
        "group": "pair", "messages": ASK, "temperature": 0, "max_tokens": 8})
    assert r.status_code == 200, r.text
    members = {m["model"]: m for m in r.json()["members"]}
    for model in ("qwen3-style", "no-thinking"):
        asked = httpx.post(server.base + "/tokenize", json={"model": model, "messages": ASK}).json()["count"]
        assert members[model]["usage"]["prompt_tokens"] == asked
    assert prompt_text(server, "no-thinking").endswith("<think>\n\n</think>\n\n")


def test_gpt_oss_analysis_channel_is_the_reasoning_and_its_effort_reaches_the_template(server):
    """gpt-oss writes `<|channel|>analysis<|message|>...<|end|>` and then its answer after
    `<|start|>assistant<|channel|>final<|message|>` (control tokens, hidden in plain text): the
    server writes them out, gives the analysis as reasoning and the final channel as content."""
    raw = chat(server, "harmony", grammar=HARMONY, reasoning_format="none")["message"]["content"]
    assert raw.startswith("<|channel|>analysis<|message|>") and "<|end|><|start|>assistant<|channel|>final" in raw
    thought, answer = raw[len("<|channel|>analysis<|message|>"):].split("<|end|><|start|>assistant<|channel|>final"
                                                                        "<|message|>")
    choice = chat(server, "harmony", grammar=HARMONY)
    assert choice["message"]["reasoning_content"] == thought.strip() and thought.strip()
    assert choice["message"]["content"] == answer.lstrip() and answer.strip()
    assert stream(server, "harmony", grammar=HARMONY) == (thought.strip(), answer.lstrip(), "stop")
    for effort in ("low", "high"):
        r = httpx.post(server.base + "/apply-template", timeout=60, json={
            "model": "harmony", "messages": ASK, "reasoning_effort": effort})
        assert r.status_code == 200 and f"Reasoning: {effort}<|end|>" in r.json()["prompt"], r.text


def test_a_budget_closes_gpt_oss_analysis_with_its_final_channels_header(server):
    body = {"thinking_budget_tokens": 4, "max_tokens": 24,
            "logit_bias": {str(t): -100 for t in (0, 2, 8, 10, 11)}}  # the untrained model does not stop first
    raw = chat(server, "harmony-opened", reasoning_format="none", **body)["message"]["content"]
    assert "<|end|><|start|>assistant<|channel|>final<|message|>" in raw, raw
    choice = chat(server, "harmony-opened", **body)
    assert choice["message"]["reasoning_content"] == raw.split("<|end|>")[0].strip()
    assert choice["message"]["content"] == raw.split("<|channel|>final<|message|>", 1)[1].lstrip()
    assert "<|" not in choice["message"]["content"]


ANSWER = {"type": "json_schema", "json_schema": {"name": "a", "schema": {
    "type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}}}


def test_structured_output_comes_after_the_thinking_a_model_opens_itself(server):
    """gpt-oss opens its analysis channel itself: the schema's grammar leaves room for it (bounded
    by the budget, in the grammar) and holds the final channel's answer. The untrained model is
    pushed into the channel by a bias on its first token."""
    r = httpx.post(server.base + "/tokenize", timeout=60, json={"model": "harmony", "content": "analysis",
                                                                  "add_special": False})
    first = r.json()["tokens"][0]
    body = {"response_format": ANSWER, "thinking_budget_tokens": 6, "logit_bias": {str(first): 100}}
    raw = chat(server, "harmony", reasoning_format="none", **body)["message"]["content"]
    assert raw.startswith("<|channel|>analysis<|message|>"), raw
    thought, answer = raw[len("<|channel|>analysis<|message|>"):].split(
        "<|end|><|start|>assistant<|channel|>final<|message|>")
    choice = chat(server, "harmony", **body)
    assert choice["message"]["reasoning_content"] == thought.strip() and isinstance(
        json.loads(choice["message"]["content"])["answer"], int)
    assert choice["message"]["content"] == answer.lstrip()
    tokens = httpx.post(server.base + "/tokenize", timeout=60, json={
        "model": "harmony", "content": thought, "add_special": False, "parse_special": True}).json()["count"]
    assert tokens <= 6  # the budget, held by the grammar
    plain = chat(server, "qwen3-style", response_format=ANSWER)  # a <think> model that does not think: the JSON
    assert isinstance(json.loads(plain["message"]["content"])["answer"], int)
