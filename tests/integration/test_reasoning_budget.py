"""Reasoning budgets (engine/reasoning.py BudgetWatch): a think block bounded to N tokens, after
which the server forces the budget message and `</think>` and the model answers. SmolLM2 served
with DeepSeek-R1's template shape (the prompt opens the block): the untrained model never closes
it itself, so every cut is the server's, at exactly the budget."""

from __future__ import annotations

import json

import anthropic
import httpx
import ollama
import openai
import pytest
import yaml

from conftest import SMOLLM2, model_entry
from reasoning_templates import OPENED

ASK = [{"role": "user", "content": "What is two plus two?"}]
CLOSE = "\n</think>\n\n"
MESSAGE = "Time to answer."


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory({"models": [
        model_entry("opened", SMOLLM2, n_parallel=2, chat_template=OPENED),
        model_entry("budgeted", SMOLLM2, n_parallel=2, chat_template=OPENED, reasoning_budget=8,
                    reasoning_budget_message=MESSAGE, reasoning_effort_budgets={"low": 3}),
        model_entry("plain", SMOLLM2, n_parallel=1),
    ], "groups": [
        {"name": "chain", "models": ["budgeted", "opened"], "type": "sequential"},
    ]}, "budget")


def chat(server, model: str, **kw) -> dict:
    r = httpx.post(server.base + "/v1/chat/completions", timeout=300, json={
        "model": model, "messages": ASK, "temperature": 0, "max_tokens": 40, **kw})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def tokens(server, model: str, **kw) -> list[bytes]:
    """The answer's tokens, as the model wrote them (think block in the content)."""
    choice = chat(server, model, reasoning_format="none", logprobs=True, **kw)
    pieces = [bytes(t["bytes"]) for t in choice["logprobs"]["content"]]
    assert text_of(pieces) == choice["message"]["content"]
    return pieces


def text_of(pieces: list[bytes]) -> str:
    return b"".join(pieces).decode("utf-8", "replace")


def close_tokens(server, model: str, text: str) -> int:
    r = httpx.post(server.base + "/tokenize", timeout=60, json={
        "model": model, "content": text, "add_special": False, "parse_special": True})
    assert r.status_code == 200, r.text
    return r.json()["count"]


def cut_at(pieces: list[str], budget: int, message: str = "") -> str:
    """The answer's text after a cut at `budget`: what follows the forced close."""
    text = text_of(pieces)
    head = text_of(pieces[:budget])
    assert text.startswith(head + message + CLOSE), text
    return text[len(head + message + CLOSE):]


@pytest.mark.parametrize("budget", [1, 5, 12])
def test_a_budget_cuts_the_block_after_that_many_tokens_and_the_model_answers(server, budget):
    free = tokens(server, "opened")
    assert "</think>" not in text_of(free)  # the untrained model never closes the block itself
    cut = tokens(server, "opened", thinking_budget_tokens=budget)
    assert cut[:budget] == free[:budget]  # the same tokens up to the budget
    assert cut_at(cut, budget).strip()  # the answer goes on after the block
    split = chat(server, "opened", thinking_budget_tokens=budget)["message"]
    assert split["reasoning_content"] == text_of(free[:budget]).strip()
    assert split["content"] == cut_at(cut, budget).lstrip()


def test_budget_zero_closes_the_block_at_once(server):
    pieces = tokens(server, "opened", thinking_budget_tokens=0)
    assert text_of(pieces).startswith(CLOSE)
    message = chat(server, "opened", thinking_budget_tokens=0)["message"]
    assert not message.get("reasoning_content") and message["content"].strip()
    assert "</think>" not in message["content"]


def test_the_models_budget_and_message_apply_unless_the_request_says(server):
    configured = tokens(server, "budgeted")
    free = tokens(server, "opened")
    assert configured[:8] == free[:8]
    assert cut_at(configured, 8, MESSAGE).strip()
    assert tokens(server, "budgeted", thinking_budget_tokens=-1) == free  # -1: no bound
    assert cut_at(tokens(server, "budgeted", thinking_budget_tokens=2), 2, MESSAGE)


def test_reasoning_effort_picks_its_budget(server):
    free = tokens(server, "opened")
    assert cut_at(tokens(server, "budgeted", reasoning_effort="low"), 3, MESSAGE)
    assert cut_at(tokens(server, "budgeted", reasoning_effort="high"), 8, MESSAGE)  # not listed: the model's
    assert tokens(server, "opened", reasoning_effort="low") == free  # no budgets configured: no bound


def test_streamed_and_whole_answers_agree_and_speculation_changes_nothing(server):
    whole = chat(server, "budgeted", thinking_budget_tokens=6, max_tokens=50)
    reasoning = content = ""
    with httpx.stream("POST", server.base + "/v1/chat/completions", timeout=300, json={
            "model": "budgeted", "messages": ASK, "temperature": 0, "max_tokens": 50, "stream": True,
            "thinking_budget_tokens": 6}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                reasoning += delta.get("reasoning_content") or ""
                content += delta.get("content") or ""
    assert (reasoning, content) == (whole["message"]["reasoning_content"], whole["message"]["content"])
    solo = chat(server, "budgeted", thinking_budget_tokens=6, max_tokens=50, speculative=False)
    assert solo["message"] == whole["message"]


def test_a_sampled_answer_is_cut_too(server):
    pieces = tokens(server, "opened", thinking_budget_tokens=4, temperature=0.9, seed=7, presence_penalty=0.5)
    assert cut_at(pieces, 4) is not None


def test_structured_output_holds_the_answer_after_the_bounded_block(server):
    """The prompt opened the block: the grammar waits until the budget closes it, then holds the
    answer to the schema (the thinking is free, as llama-server and vLLM leave it)."""
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]}
    choice = chat(server, "budgeted", max_tokens=60,
                  response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
    assert choice["finish_reason"] == "stop", choice
    assert choice["message"]["reasoning_content"].endswith(MESSAGE), choice
    assert isinstance(json.loads(choice["message"]["content"])["answer"], int), choice
    raw = tokens(server, "budgeted", response_format={"type": "json_object"}, max_tokens=60)
    assert cut_at(raw, 8, MESSAGE).startswith("{")  # 8 tokens of thought, the close, then the object


def test_a_model_without_think_tags_is_not_bounded(server):
    assert tokens(server, "plain", thinking_budget_tokens=0) == tokens(server, "plain")


def test_cuts_are_counted(server):
    def cuts() -> float:
        text = httpx.get(server.base + "/metrics", timeout=30).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("eie_reasoning_budget_cuts_total{") and 'model="opened"' in line)
    before = cuts()
    chat(server, "opened", thinking_budget_tokens=3)
    assert cuts() == before + 1


@pytest.mark.parametrize("body,param", [
    ({"thinking_budget_tokens": -2}, "thinking_budget_tokens"),
    ({"thinking_budget_tokens": "many"}, "thinking_budget_tokens"),
    ({"reasoning_effort": "huge"}, "reasoning_effort"),
])
def test_bad_budget_fields_are_refused_by_name(server, body, param):
    r = httpx.post(server.base + "/v1/chat/completions", timeout=60, json={"model": "opened", "messages": ASK, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_group_member_keeps_its_models_budget(server):
    r = httpx.post(server.base + "/v1/chain/execute", timeout=300, json={
        "group": "chain", "messages": ASK, "temperature": 0, "max_tokens": 40})
    assert r.status_code == 200, r.text
    first = r.json()["members"][0]
    alone = chat(server, "budgeted")["message"]
    assert first["reasoning_content"] == alone["reasoning_content"] and first["text"] == alone["content"]


def test_a_group_request_bounds_its_members_as_a_chat_request_does(server):
    def first_member(**kw) -> dict:
        r = httpx.post(server.base + "/v1/chain/execute", timeout=300, json={
            "group": "chain", "messages": ASK, "temperature": 0, "max_tokens": 40, **kw})
        assert r.status_code == 200, r.text
        return r.json()["members"][0]
    assert first_member(thinking_budget_tokens=2)["reasoning_content"] == chat(
        server, "budgeted", thinking_budget_tokens=2)["message"]["reasoning_content"]
    assert first_member(reasoning_effort="low")["reasoning_content"] == chat(
        server, "budgeted", reasoning_effort="low")["message"]["reasoning_content"]
    r = httpx.post(server.base + "/v1/chat/completions", timeout=300, json={
        "model": "chain", "messages": ASK, "temperature": 0, "max_tokens": 40, "thinking_budget_tokens": 2})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens_details"]["reasoning_tokens"] >= 2


def test_the_responses_api_bounds_by_effort(server):
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="none")
    r = client.responses.create(model="budgeted", input=ASK[0]["content"], temperature=0, max_output_tokens=40,
                                reasoning={"effort": "low"})
    alone = chat(server, "budgeted", reasoning_effort="low")["message"]
    reasoning = next(item for item in r.output if item.type == "reasoning")
    assert reasoning.content[0].text == alone["reasoning_content"]
    assert r.output_text == alone["content"]
    bad = httpx.post(server.base + "/v1/responses", timeout=60, json={
        "model": "opened", "input": "hi", "reasoning": {"effort": "huge"}})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "reasoning.effort"


def test_anthropic_budget_tokens_bound_the_thinking_block(server):
    client = anthropic.Anthropic(base_url=server.base, api_key="none")
    m = client.messages.create(model="opened", max_tokens=40, messages=ASK, extra_body={"temperature": 0},
                               thinking={"type": "enabled", "budget_tokens": 5})
    alone = chat(server, "opened", thinking_budget_tokens=5)["message"]
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking == alone["reasoning_content"] and m.content[1].text == alone["content"]
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model="opened", max_tokens=40, messages=ASK,
                               thinking={"type": "enabled", "budget_tokens": 40})
    assert e.value.body["error"]["param"] == "thinking.budget_tokens"


def test_ollama_think_levels_use_the_effort_budgets(server):
    client = ollama.Client(host=server.base)
    r = client.chat(model="budgeted", messages=ASK, think="low", options={"temperature": 0, "num_predict": 40})
    alone = chat(server, "budgeted", reasoning_effort="low")["message"]
    assert r.message.thinking == alone["reasoning_content"] and r.message.content == alone["content"]


def usage_of(server, model: str, **kw) -> dict:
    r = httpx.post(server.base + "/v1/chat/completions", timeout=300, json={
        "model": model, "messages": ASK, "temperature": 0, "max_tokens": 40, **kw})
    assert r.status_code == 200, r.text
    return r.json()["usage"]


def test_usage_counts_the_tokens_generated_inside_the_block(server):
    cut = usage_of(server, "opened", thinking_budget_tokens=6)
    assert cut["completion_tokens_details"]["reasoning_tokens"] == 6 < cut["completion_tokens"]
    free = usage_of(server, "opened")  # never closed: every token is reasoning
    assert free["completion_tokens_details"]["reasoning_tokens"] == free["completion_tokens"] == 40
    assert "completion_tokens_details" not in usage_of(server, "plain")
    streamed = None
    with httpx.stream("POST", server.base + "/v1/chat/completions", timeout=300, json={
            "model": "opened", "messages": ASK, "temperature": 0, "max_tokens": 40, "thinking_budget_tokens": 6,
            "stream": True, "stream_options": {"include_usage": True}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and (chunk := json.loads(line[6:])).get("usage"):
                streamed = chunk["usage"]
    assert streamed == cut
    client = openai.OpenAI(base_url=server.base + "/v1", api_key="none")
    r = client.responses.create(model="opened", input=ASK[0]["content"], temperature=0, max_output_tokens=40,
                                extra_body={"thinking_budget_tokens": 6})
    assert r.usage.output_tokens_details.reasoning_tokens == 6
    group = httpx.post(server.base + "/v1/chat/completions", timeout=300, json={
        "model": "chain", "messages": ASK, "temperature": 0, "max_tokens": 40}).json()["usage"]
    # the budgeted member thinks 8 tokens; the second never closes its block
    second = group["completion_tokens"] - usage_of(server, "budgeted")["completion_tokens"]
    assert group["completion_tokens_details"]["reasoning_tokens"] == 8 + second


def test_a_reload_changes_a_models_budget_for_the_next_request(server):
    """Last in this module: it changes the server's config (and puts it back)."""
    before = server.config_path.read_text()
    cfg = yaml.safe_load(before)
    cfg["models"][1]["reasoning_budget"] = 3
    try:
        server.config_path.write_text(yaml.safe_dump(cfg))
        r = httpx.post(server.base + "/v1/admin/config/reload", timeout=60)
        assert r.status_code == 200 and r.json()["applied"] == ["models.budgeted.reasoning_budget"], r.text
        assert r.json()["restart_required"] == []
        assert cut_at(tokens(server, "budgeted"), 3, MESSAGE)
    finally:
        server.config_path.write_text(before)
        assert httpx.post(server.base + "/v1/admin/config/reload", timeout=60).status_code == 200
    assert cut_at(tokens(server, "budgeted"), 8, MESSAGE)
