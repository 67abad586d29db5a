"""Model groups against real models: parallel, sequential, fanout, every fallback and selection."""

from __future__ import annotations

import json

import anthropic
import httpx
import openai
import pytest

from conftest import GEMMA3, SMOLLM2, model_entry
from opshelp import metric, wait_for

Q = [{"role": "user", "content": "What is 2+2? Answer with a number."}]
# For the member timeouts (150 ms): an answer of a few tokens can come within them (a decode step
# is ~5 ms, and speculation copies an answer given before), a story of 300 tokens cannot.
LONG = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]


@pytest.fixture(scope="module")
def groups_server(server_factory, tmp_path_factory):
    corrupt = tmp_path_factory.mktemp("corrupt") / "corrupt.gguf"
    data = bytearray(SMOLLM2.read_bytes()[: 4 << 20])
    data[8:16] = b"\xff" * 8  # a tensor count no file can hold
    corrupt.write_bytes(bytes(data))
    member = {"n_ctx": 1024, "n_parallel": 4}
    return server_factory(
        {
            "models": [
                model_entry("smollm2-135m", SMOLLM2, **member),
                model_entry("smollm2-135m-b", SMOLLM2, **member),
                model_entry("gemma3-270m", GEMMA3, **member),
                model_entry("corrupt", corrupt),
            ],
            "groups": [
                {"name": "core", "models": ["smollm2-135m", "gemma3-270m", "smollm2-135m-b"], "type": "parallel"},
                {"name": "strict", "models": ["smollm2-135m", "corrupt"], "fallback": "strict"},
                {"name": "partial", "models": ["smollm2-135m", "corrupt"], "fallback": "partial",
                 "required_responses": 1},
                {"name": "retry", "models": ["smollm2-135m", "smollm2-135m-b"], "fallback": "retry_once",
                 "member_timeout_ms": {"smollm2-135m-b": 150}},
                {"name": "replace", "models": ["corrupt", "smollm2-135m"],
                 "fallback": {"replace_with": "smollm2-135m-b"}},
                {"name": "slow-partial", "models": ["smollm2-135m", "gemma3-270m"], "fallback": "partial",
                 "member_timeout_ms": {"gemma3-270m": 150}},
                {"name": "chain", "models": ["smollm2-135m", "smollm2-135m-b"], "type": "sequential",
                 "prompt_templates": [None, "Translate to French: {input}"]},
                {"name": "chain-replace", "models": ["smollm2-135m", "corrupt"], "type": "sequential",
                 "prompt_templates": [None, "Translate to French: {input}"],
                 "fallback": {"replace_with": "smollm2-135m-b"}},
                {"name": "chain-partial", "models": ["corrupt", "smollm2-135m"], "type": "sequential"},
                {"name": "chain-strict", "models": ["smollm2-135m", "smollm2-135m-b"], "type": "sequential",
                 "prompt_templates": [None, "Translate to French: {input}"], "fallback": "strict"},
                {"name": "chain-strict-fails", "models": ["smollm2-135m", "corrupt"], "type": "sequential",
                 "fallback": "strict"},
                {"name": "vote", "models": ["smollm2-135m"], "type": "fanout", "samples": 4, "select": "consensus"},
                {"name": "logprob", "models": ["smollm2-135m", "gemma3-270m"], "type": "fanout", "samples": 2,
                 "select": "logprob"},
                {"name": "judge", "models": ["smollm2-135m", "smollm2-135m-b"], "type": "fanout",
                 "select": "judge:smollm2-135m"},
                {"name": "first", "models": ["smollm2-135m", "gemma3-270m"], "type": "fanout", "select": "first"},
                {"name": "twice", "models": ["smollm2-135m", "smollm2-135m"], "type": "parallel"},
                {"name": "partial-late", "models": ["corrupt", "smollm2-135m"], "fallback": "partial"},
            ],
        },
        "groups",
    )


def run(srv, group: str, path: str = "/v1/batch/execute", timeout: float = 120, **kw) -> httpx.Response:
    body = {"group": group, "messages": Q, "max_tokens": 24, "temperature": 0, **kw}
    return httpx.post(srv.base + path, json=body, timeout=timeout)


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def chat(srv, model: str, content: str, max_tokens: int = 24) -> str:
    r = httpx.post(srv.base + "/v1/chat/completions", timeout=60, json={
        "model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
        "temperature": 0})
    return r.json()["choices"][0]["message"]["content"]


def test_parallel_group_returns_every_members_answer(groups_server):
    body = ok(run(groups_server, "core"))
    assert body["complete"] is True and body["type"] == "parallel"
    assert [m["model"] for m in body["members"]] == ["smollm2-135m", "gemma3-270m", "smollm2-135m-b"]
    assert all(m["status"] == "ok" and m["text"] for m in body["members"])
    # Each answer is that model's own answer to the same prompt.
    assert body["members"][0]["text"] == chat(groups_server, "smollm2-135m", Q[0]["content"])
    assert body["members"][1]["text"] == chat(groups_server, "gemma3-270m", Q[0]["content"])
    assert body["usage"]["completion_tokens"] == sum(m["usage"]["completion_tokens"] for m in body["members"])


def test_strict_fails_the_request_with_member_results(groups_server):
    r = run(groups_server, "strict")
    assert r.status_code == 502
    body = r.json()
    assert body["error"]["code"] == "group_failed"
    members = body["result"]["members"]
    assert members[0]["status"] == "ok" and members[0]["text"]
    assert members[1]["status"] == "failed" and "corrupt" in members[1]["error"]
    assert body["result"]["complete"] is False


def test_partial_returns_what_finished(groups_server):
    body = ok(run(groups_server, "partial"))
    assert [m["status"] for m in body["members"]] == ["ok", "failed"]
    assert body["complete"] is True  # required_responses: 1
    body = ok(run(groups_server, "slow-partial", max_tokens=300, messages=LONG))
    statuses = {m["model"]: m["status"] for m in body["members"]}
    assert statuses == {"smollm2-135m": "ok", "gemma3-270m": "timeout"}
    assert body["complete"] is False


def test_retry_once_retries_then_behaves_as_partial(groups_server):
    body = ok(run(groups_server, "retry", max_tokens=300, messages=LONG))
    fast, slow = body["members"]
    assert fast["status"] == "ok" and fast["attempts"] == 1
    assert slow["status"] == "timeout" and slow["attempts"] == 2
    assert "member_timeout_ms" in slow["error"], slow  # its own bound (it read "request deadline passed")
    assert body["complete"] is False


def test_replace_with_runs_the_backup_in_place(groups_server):
    body = ok(run(groups_server, "replace"))
    broken, healthy = body["members"]
    assert broken["status"] == "replaced" and broken["replaced_by"] == "smollm2-135m-b"
    assert broken["text"] == healthy["text"]  # same weights, same prompt, temperature 0
    assert "corrupt failed" in broken["error"]
    assert body["complete"] is True


def test_chain_passes_output_to_input(groups_server):
    r = run(groups_server, "chain", path="/v1/chain/execute")
    body = ok(r)
    first, second = body["members"]
    assert first["status"] == second["status"] == "ok"
    # The second member saw the first one's output through its template.
    assert second["text"] == chat(groups_server, "smollm2-135m-b", f"Translate to French: {first['text']}")
    assert body["output"] == second["text"]
    assert run(groups_server, "core", path="/v1/chain/execute").status_code == 400
    assert run(groups_server, "chain").status_code == 400


def test_chain_replacement_output_continues_the_chain(groups_server):
    body = ok(run(groups_server, "chain-replace", path="/v1/chain/execute"))
    first, second = body["members"]
    assert second["status"] == "replaced" and second["replaced_by"] == "smollm2-135m-b"
    assert second["text"] == chat(groups_server, "smollm2-135m-b", f"Translate to French: {first['text']}")
    assert body["output"] == second["text"] and body["complete"] is True


def test_chain_partial_stops_and_skips_the_rest(groups_server):
    """Its first member failed, so no member answered: the request failed whatever the fallback
    (it was a 200 with no output, and asked as a model an empty answer with finish_reason stop)."""
    r = run(groups_server, "chain-partial", path="/v1/chain/execute")
    assert r.status_code == 502, r.text
    body = r.json()
    assert body["error"]["code"] == "group_failed" and "corrupt" in body["error"]["message"]
    assert [m["status"] for m in body["result"]["members"]] == ["failed", "skipped"]
    assert body["result"]["complete"] is False and body["result"]["output"] is None
    for path, extra in (("/v1/chat/completions", {}), ("/v1/chat/completions", {"stream": True}),
                        ("/v1/messages", {}), ("/api/chat", {"stream": False})):
        with httpx.stream("POST", groups_server.base + path, timeout=120, json={
                "model": "chain-partial", "messages": Q, "max_tokens": 8, **extra}) as s:
            text = s.read().decode()
        assert s.status_code == 502 or '"group_failed"' in text, (path, extra, s.status_code, text)


def test_a_request_every_member_refuses_is_the_clients_400(groups_server):
    """Every member refused the request itself (its prompt is longer than their contexts): the
    request's fault, a 400 naming the field as a model would give it, not a 502 (nor a 200 with no
    answer, as it was under partial)."""
    long = [{"role": "user", "content": " ".join(["zebra quokka"] * 600)}]
    for path, body in (("/v1/batch/execute", {"group": "core"}), ("/v1/chat/completions", {"model": "vote"}),
                       ("/v1/chat/completions", {"model": "core", "stream": True})):
        r = httpx.post(groups_server.base + path, timeout=120, json={**body, "messages": long, "max_tokens": 8})
        assert r.status_code == 400, (path, body, r.text)
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and err["param"] == "messages", err


def _restored(server, model: str) -> int:
    return httpx.get(server.base + "/v1/admin/scheduling/status").json()["models"][model]["prefix_tokens_restored"]


def _prefill(srv, model: str) -> int:
    return httpx.get(srv.base + "/v1/admin/scheduling/status").json()["models"][model]["prefill_tokens"]


def test_fanout_consensus_shares_the_prompt_kv(groups_server):
    before, restored_before = _prefill(groups_server, "smollm2-135m"), _restored(groups_server, "smollm2-135m")
    body = ok(run(groups_server, "vote", temperature=0.8, seed=7))
    after, restored = _prefill(groups_server, "smollm2-135m"), _restored(groups_server, "smollm2-135m") - restored_before
    members = body["members"]
    assert len(members) == 4 and all(m["status"] == "ok" for m in members)
    prompt = members[0]["usage"]["prompt_tokens"]
    # one prefill (less what the prefix cache restored from earlier tests' identical prompts);
    # each other sample computes its last prompt token only
    assert after - before == prompt - restored + 3
    # the samples share one prefill: the prompt counts once, as n choices count it (it was 4 times)
    assert body["usage"]["prompt_tokens"] == prompt
    sel = body["selected"]
    assert body["output"] == members[sel["index"]]["text"]
    assert sel["reason"].startswith(("majority", "no majority"))
    from appliance.groups.select import consensus

    assert consensus([m["text"] for m in members])[0] == sel["index"]


def test_fanout_logprob_picks_the_most_likely_answer(groups_server):
    body = ok(run(groups_server, "logprob", temperature=0.8, seed=3))
    members = body["members"]
    assert len(members) == 4
    best = max(members, key=lambda m: m["mean_logprob"])
    assert body["selected"]["index"] == best["index"]
    assert "log-probability" in body["selected"]["reason"]


def test_fanout_judge_asks_the_judge_model(groups_server):
    body = ok(run(groups_server, "judge", temperature=0.8, seed=11))
    sel = body["selected"]
    assert sel["reason"].startswith(("judge smollm2-135m chose answer", "judge gave no valid choice"))
    assert body["output"] == body["members"][sel["index"]]["text"]


def test_fanout_first_takes_the_first_valid_answer(groups_server):
    body = ok(run(groups_server, "first", max_tokens=200))
    sel = body["selected"]
    assert sel["reason"].startswith("first valid answer")
    chosen = body["members"][sel["index"]]
    assert chosen["status"] == "ok"
    others = [m for m in body["members"] if m["index"] != sel["index"]]
    assert all(m["status"] in ("ok", "skipped") for m in others)


def test_group_streaming_tags_events_with_the_member_model(groups_server):
    body = {"group": "core", "messages": Q, "max_tokens": 12, "temperature": 0, "stream": True}
    events = []
    with httpx.stream("POST", groups_server.base + "/v1/batch/execute", json=body, timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: "):
                events.append(line[6:])
    assert events[-1] == "[DONE]"
    parsed = [json.loads(e) for e in events[:-1]]
    final = parsed[-1]
    assert final["type"] == "group.done" and final["result"]["complete"]
    for m in final["result"]["members"]:
        streamed = "".join(e["text"] for e in parsed if e["type"] == "member.delta" and e["index"] == m["index"])
        assert streamed == m["text"]
        assert all(e["model"] == m["model"] for e in parsed if e["type"] == "member.delta" and e["index"] == m["index"])
    assert sum(1 for e in parsed if e["type"] == "member.done") == 3


def test_unknown_group_is_404(groups_server):
    r = run(groups_server, "nope")
    assert r.status_code == 404 and r.json()["error"]["param"] == "group"


# ---- a group asked as a model (/v1/chat/completions; api/group_chat.py) -----------------------


def group_chat(srv, group: str, stream: bool = False, **kw) -> dict | list[dict]:
    body = {"model": group, "messages": Q, "max_tokens": 24, "temperature": 0, "stream": stream, **kw}
    if not stream:
        return ok(httpx.post(srv.base + "/v1/chat/completions", json=body, timeout=120))
    with httpx.stream("POST", srv.base + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def streamed_choices(chunks: list[dict]) -> dict[int, tuple[str, str]]:
    """Each choice's text and finish reason, from a stream's chunks."""
    texts: dict[int, list[str]] = {}
    reasons: dict[int, str] = {}
    for chunk in chunks:
        for c in chunk["choices"]:
            texts.setdefault(c["index"], []).append(c["delta"].get("content") or "")
            if c["finish_reason"]:
                reasons[c["index"]] = c["finish_reason"]
    return {i: ("".join(t), reasons.get(i)) for i, t in texts.items()}


def test_a_parallel_group_asked_as_a_model_answers_each_member_as_a_choice(groups_server):
    members = ok(run(groups_server, "core"))["members"]
    body = group_chat(groups_server, "core")
    assert body["model"] == "core" and body["object"] == "chat.completion"
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in body["choices"]] == [
        (m["index"], m["text"], m["finish_reason"]) for m in members]
    assert body["usage"]["completion_tokens"] == sum(m["usage"]["completion_tokens"] for m in members)
    chunks = group_chat(groups_server, "core", stream=True, stream_options={"include_usage": True})
    assert streamed_choices(chunks[:-1]) == {c["index"]: (c["message"]["content"], c["finish_reason"])
                                             for c in body["choices"]}
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == body["usage"]
    # a member that failed (partial fallback) has no choice
    partial = group_chat(groups_server, "partial")
    assert [c["index"] for c in partial["choices"]] == [0]


def test_a_chain_and_a_fanout_asked_as_models_answer_their_output(groups_server):
    chain = ok(run(groups_server, "chain", "/v1/chain/execute"))
    body = group_chat(groups_server, "chain")
    assert [c["message"]["content"] for c in body["choices"]] == [chain["output"]]
    assert streamed_choices(group_chat(groups_server, "chain", stream=True)) == {
        0: (chain["output"], chain["members"][-1]["finish_reason"])}
    vote = ok(run(groups_server, "vote"))
    body = group_chat(groups_server, "vote")
    assert [c["message"]["content"] for c in body["choices"]] == [vote["output"]]
    assert streamed_choices(group_chat(groups_server, "vote", stream=True))[0][0] == vote["output"]


def test_a_strict_group_that_fails_asked_as_a_model(groups_server):
    r = httpx.post(groups_server.base + "/v1/chat/completions", timeout=120, json={
        "model": "strict", "messages": Q, "max_tokens": 24, "temperature": 0})
    assert r.status_code == 502 and r.json()["error"]["code"] == "group_failed"
    with httpx.stream("POST", groups_server.base + "/v1/chat/completions", timeout=120, json={
            "model": "strict", "messages": Q, "max_tokens": 24, "temperature": 0, "stream": True}) as s:
        lines = [line for line in s.iter_lines() if line]
    # members stream as they write under strict: the failure comes before any text (502) or in-band
    assert s.status_code == 502 or ('"group_failed"' in lines[-2] and lines[-1] == "data: [DONE]")


def test_groups_are_listed_as_models_and_per_model_fields_are_refused(groups_server):
    cards = {c["id"]: c for c in httpx.get(groups_server.base + "/v1/models").json()["data"]}
    assert cards["chain"]["kind"] == "group" and cards["chain"]["group_type"] == "sequential"
    assert cards["chain"]["members"] == ["smollm2-135m", "smollm2-135m-b"] and cards["chain"]["state"] == "ready"
    assert cards["strict"]["state"] == "failed"  # a member did not load
    assert cards["smollm2-135m"]["kind"] == "chat" and cards["smollm2-135m"]["group_type"] is None
    for extra, param in (({"n": 2}, "n"), ({"logprobs": True}, "logprobs"), ({"logit_bias": {"1": 1}}, "logit_bias"),
                         ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
                         ({"continue_final_message": True}, "continue_final_message")):
        r = httpx.post(groups_server.base + "/v1/chat/completions", json={
            "model": "core", "messages": Q, **extra})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_ollama_clients_ask_a_chain_or_a_fanout_as_a_model(groups_server):
    chain = ok(run(groups_server, "chain", "/v1/chain/execute", top_k=40, top_p=0.9))
    body = {"model": "chain", "messages": Q, "options": {"temperature": 0, "num_predict": 24}}
    whole = ok(httpx.post(groups_server.base + "/api/chat", json={**body, "stream": False}, timeout=120))
    assert whole["message"]["content"] == chain["output"] and whole["done"] and whole["done_reason"] == "stop"
    assert whole["eval_count"] == sum(m["usage"]["completion_tokens"] for m in chain["members"])
    lines = httpx.post(groups_server.base + "/api/chat", json=body, timeout=120).text.splitlines()
    assert [json.loads(line)["message"]["content"] for line in lines] == [chain["output"], ""]
    listed = {m["name"]: m for m in httpx.get(groups_server.base + "/api/tags").json()["models"]}
    assert listed["chain"]["details"]["family"] == "group" and "vote" in listed and "core" not in listed
    r = httpx.post(groups_server.base + "/api/chat", json={**body, "model": "core", "stream": False})
    assert r.status_code == 400 and r.json()["param"] == "model"
    # what /api/tags lists, /api/show shows and /api/generate answers (both were 404s)
    shown = ok(httpx.post(groups_server.base + "/api/show", json={"model": "chain"}))
    assert shown["details"]["family"] == "group" and shown["model_info"]["eie.group.models"] == listed["chain"]["details"]["families"]
    ask = {"model": "chain", "prompt": Q[0]["content"], "stream": False, "options": body["options"]}
    generated = ok(httpx.post(groups_server.base + "/api/generate", json=ask, timeout=120))
    assert generated["response"] == chain["output"] and generated["done_reason"] == "stop"
    assert generated["total_duration"] > generated["eval_duration"] > 1e6  # (not the ~40 µs of a writer made last)
    r = httpx.post(groups_server.base + "/api/generate", json={**ask, "raw": True})
    assert r.status_code == 400 and r.json()["param"] == "raw"
    # think on or off (Home Assistant sends think: false on every request) is each member's switch
    # (a 400 naming chat_template_kwargs, a field neither request has)
    for think in (False, True):
        r = httpx.post(groups_server.base + "/api/chat", timeout=120, json={**body, "stream": False, "think": think})
        assert r.status_code == 200 and r.json()["message"]["content"], r.text
    r = httpx.post(groups_server.base + "/v1/messages", timeout=120, json={
        "model": "chain", "messages": Q, "max_tokens": 8, "thinking": {"type": "disabled"}})
    assert r.status_code == 200, r.text


def test_the_responses_and_messages_apis_ask_a_chain_as_a_model(groups_server):
    chain = ok(run(groups_server, "chain", "/v1/chain/execute"))
    made = ok(httpx.post(groups_server.base + "/v1/responses", timeout=120, json={
        "model": "chain", "input": Q, "max_output_tokens": 24, "temperature": 0}))
    assert made["output"][-1]["content"][0]["text"] == chain["output"] and made["status"] == "completed"
    assert made["usage"]["output_tokens"] == sum(m["usage"]["completion_tokens"] for m in chain["members"])
    went_on = httpx.post(groups_server.base + "/v1/responses", timeout=120, json={
        "model": "chain", "previous_response_id": made["id"], "input": "Thanks", "max_output_tokens": 8,
        "temperature": 0, "stream": True})
    events = [json.loads(line[6:]) for line in went_on.text.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "response.created"
    last = events[-1]["response"]
    assert events[-1]["type"] == f"response.{last['status']}" and last["previous_response_id"] == made["id"]
    # the chain's first member was asked the whole conversation: more prompt than the first time
    assert last["usage"]["input_tokens"] > made["usage"]["input_tokens"]
    message = ok(httpx.post(groups_server.base + "/v1/messages", timeout=120, json={
        "model": "chain", "messages": Q, "max_tokens": 24, "temperature": 0}))
    assert message["content"] == [{"type": "text", "text": chain["output"]}] and message["stop_reason"] == "end_turn"
    r = httpx.post(groups_server.base + "/v1/messages", json={"model": "core", "messages": Q, "max_tokens": 8})
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"  # parallel: one answer per member


def test_a_strict_chain_streams_its_last_member_live_through_the_one_answer_apis(groups_server):
    chain = ok(run(groups_server, "chain-strict", "/v1/chain/execute", top_k=40, top_p=0.9))
    body = {"model": "chain-strict", "messages": Q, "options": {"temperature": 0, "num_predict": 24}}
    lines = [json.loads(line) for line in httpx.post(groups_server.base + "/api/chat", json=body,
                                                      timeout=120).text.splitlines()]
    assert len(lines) > 2 and "".join(line["message"]["content"] for line in lines) == chain["output"]
    assert lines[-1]["done"] and lines[-1]["eval_count"] == sum(m["usage"]["completion_tokens"] for m in chain["members"])
    greedy = ok(run(groups_server, "chain-strict", "/v1/chain/execute"))
    client = anthropic.Anthropic(base_url=groups_server.base, api_key="none")
    with client.messages.stream(model="chain-strict", max_tokens=24, messages=Q, extra_body={"temperature": 0}) as s:
        texts = list(s.text_stream)
        message = s.get_final_message()
    assert len(texts) > 1 and "".join(texts) == greedy["output"] == message.content[0].text
    assert message.usage.input_tokens == sum(m["usage"]["prompt_tokens"] for m in greedy["members"])
    responses = openai.OpenAI(base_url=groups_server.base + "/v1", api_key="none")
    with responses.responses.stream(model="chain-strict", input=Q, max_output_tokens=24, temperature=0) as s:
        deltas = [e.delta for e in s if e.type == "response.output_text.delta"]
        final = s.get_final_response()
    assert len(deltas) > 1 and "".join(deltas) == final.output_text == greedy["output"]
    # the second member fails before it writes: nothing was sent, so the failure keeps its status
    r = httpx.post(groups_server.base + "/v1/messages", timeout=120, json={
        "model": "chain-strict-fails", "messages": Q, "max_tokens": 24, "stream": True})
    assert r.status_code == 502 and r.json()["error"]["type"] == "api_error", r.text


def _running(srv) -> dict[str, int]:
    return {m: v["running"] for m, v in httpx.get(srv.base + "/v1/admin/scheduling/status").json()["models"].items()}


def _cancelled(srv) -> float:
    return metric(httpx.get(srv.base + "/metrics").text, "eie_sequences_ended_total", reason="cancelled")


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/batch/execute", {"group": "core"}),
    ("/v1/chain/execute", {"group": "chain-strict"}),
    ("/v1/chat/completions", {"model": "chain-strict"}),
    ("/v1/batch/execute", {"group": "first"}),  # (a fanout taking the first answer kept generating)
])
def test_a_client_that_hangs_up_on_a_group_stream_cancels_its_members(groups_server, path, body):
    # a stream's writes to a gone client raise nothing: the members generated to max_tokens, each
    # holding its slot (and its key's concurrent request)
    before = _cancelled(groups_server)
    with httpx.stream("POST", groups_server.base + path, timeout=120, json={
            **body, "messages": Q, "max_tokens": 400, "temperature": 0, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                break  # hang up at the first event
    wait_for(lambda: not any(_running(groups_server).values()), timeout=10)
    assert _cancelled(groups_server) > before


def test_a_client_that_hangs_up_on_a_whole_group_answer_is_accounted_499(groups_server):
    # (it was status 0: a bogus series in the metrics, and "ok" in the audit trail)
    try:
        run(groups_server, "core", max_tokens=400, timeout=0.5)
    except httpx.TimeoutException:
        pass
    wait_for(lambda: metric(httpx.get(groups_server.base + "/metrics").text, "eie_requests_total",
                            endpoint="/v1/batch/execute", model="core", status="499") >= 1, timeout=10)
    assert 'status="0"' not in httpx.get(groups_server.base + "/metrics").text


def _member_stream(srv, group: str, **kw) -> tuple[dict[int, list[dict]], dict[int, dict]]:
    deltas: dict[int, list[dict]] = {}
    done: dict[int, dict] = {}
    with httpx.stream("POST", srv.base + "/v1/batch/execute", timeout=120, json={
            "group": group, "messages": Q, "temperature": 0, "stream": True, **kw}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                e = json.loads(line[6:])
                if e["type"] == "member.delta":
                    deltas.setdefault(e["index"], []).append(e)
                elif e["type"] == "member.done":
                    done[e["member"]["index"]] = e["member"]
    return deltas, done


def test_a_retried_or_replaced_members_stream_says_its_attempt_and_model(groups_server):
    # a retry's or a replacement's text was streamed after the failed attempt's as one text, and
    # a replacement's deltas named the failed model
    deltas, done = _member_stream(groups_server, "retry", max_tokens=300, messages=LONG)
    assert done[1]["attempts"] == 2 and 2 in {d.get("attempt", 1) for d in deltas[1]}  # (1 where it wrote in time)
    last = "".join(d["text"] for d in deltas[1] if d.get("attempt", 1) == 2)
    assert last == done[1]["text"] != ""
    deltas, done = _member_stream(groups_server, "replace", max_tokens=16)
    assert done[0]["status"] == "replaced"
    assert {(d["model"], d.get("attempt", 1)) for d in deltas[0]} == {("smollm2-135m-b", 2)}
    assert "".join(d["text"] for d in deltas[0]) == done[0]["text"]


def test_a_model_listed_twice_samples_two_seeded_answers(groups_server):
    # every member is a sample of the group: with a seed the two were the same draw
    r = run(groups_server, "twice", max_tokens=12, temperature=1.5, seed=77)
    first, second = (m["text"] for m in ok(r)["members"])
    assert first and second and first != second
    again = [m["text"] for m in ok(run(groups_server, "twice", max_tokens=12, temperature=1.5, seed=77))["members"]]
    assert again == [first, second]  # a seed still repeats its answers


def _estimate_mib(entry: dict) -> float:
    from pathlib import Path

    from appliance.config import parse_config
    from appliance.engine.manager import shape_of
    from appliance.resources.estimate import estimate
    cfg = parse_config({"models": [entry]}).models[0]
    return estimate(shape_of(Path(entry["path"])), cfg).total / (1024 * 1024)


@pytest.fixture(scope="module")
def one_at_a_time(server_factory):
    """generic, with a budget that holds one of its two models, not both."""
    small = {"n_ctx": 512, "n_parallel": 1, "n_batch": 64}
    smol, gemma = model_entry("smol", SMOLLM2, **small), model_entry("gemma", GEMMA3, **small)
    room = _estimate_mib(gemma) + 0.5 * _estimate_mib(smol)
    return server_factory({
        "policy": {"strategy": "generic", "keep_alive_s": 300},
        "vram": {"budget_mb": round(room / 0.95)},
        "models": [smol, gemma],
        "groups": [
            {"name": "chain", "models": ["smol", "gemma"], "type": "sequential"},
            {"name": "par", "models": ["smol", "gemma"], "fallback": "partial"},
            {"name": "quick", "models": ["gemma"], "timeout_ms": 50},
        ],
    }, "one-at-a-time")


def _states(srv) -> dict[str, str]:
    return {n: m["state"] for n, m in httpx.get(srv.base + "/health").json()["models"].items()}


def _only(srv, model: str) -> None:
    other = {"smol": "gemma", "gemma": "smol"}[model]
    httpx.post(srv.base + "/v1/admin/models/unload", json={"model": other}, timeout=60)
    assert httpx.post(srv.base + "/v1/admin/models/load", json={"model": model}, timeout=120).status_code == 200
    assert _states(srv) == {model: "ready", other: "unloaded"}


def test_a_chain_whose_members_take_turns_in_memory_completes(one_at_a_time):
    # the member that answered is evictable for the next one's load (its sequence was still
    # saving its conversation for the prefix cache: "no idle model can be evicted", every time)
    _only(one_at_a_time, "smol")
    r = run(one_at_a_time, "chain", path="/v1/chain/execute", max_tokens=6)
    body = ok(r)
    assert body["complete"] and [m["status"] for m in body["members"]] == ["ok", "ok"], body
    assert _states(one_at_a_time) == {"smol": "unloaded", "gemma": "ready"}


def test_a_parallel_member_is_not_evicted_by_its_siblings_load(one_at_a_time):
    # the member that took its model holds it: the sibling's load is refused, instead of evicting
    # it from under its answer ("the model was unloaded")
    _only(one_at_a_time, "smol")
    # (an answer long enough to be under way when gemma's load looks for room)
    smol, gemma = ok(run(one_at_a_time, "par", max_tokens=200, messages=LONG))["members"]
    assert smol["status"] == "ok", smol
    assert gemma["status"] == "failed" and "budget" in gemma["error"], gemma


def test_a_member_timeout_bounds_its_models_load(one_at_a_time):
    _only(one_at_a_time, "smol")
    r = run(one_at_a_time, "quick", max_tokens=6)
    assert r.status_code == 502, r.text
    (member,) = r.json()["result"]["members"]
    assert member["status"] == "timeout" and "while the model loaded" in member["error"], member


def test_a_groups_one_answer_says_its_stop_sequence_and_times_its_tokens(groups_server):
    solo = chat(groups_server, "smollm2-135m", LONG[0]["content"], max_tokens=24)
    stop = solo.split()[3]  # a word the (greedy, shared) answer holds
    message = ok(httpx.post(groups_server.base + "/v1/messages", timeout=120, json={
        "model": "vote", "messages": LONG, "max_tokens": 24, "temperature": 0, "stop_sequences": [stop]}))
    # (it said end_turn, no stop_sequence, where the model alone says which one ended it)
    assert (message["stop_reason"], message["stop_sequence"]) == ("stop_sequence", stop), message
    assert message["content"][0]["text"] == solo[:solo.index(stop)]
    # Ollama's durations: the tokens' from the first one (eval_duration was ~50 µs: clients showed
    # hundreds of thousands of tokens a second)
    whole = ok(httpx.post(groups_server.base + "/api/chat", timeout=120, json={
        "model": "vote", "messages": LONG, "stream": False, "options": {"temperature": 0, "num_predict": 16}}))
    assert whole["eval_count"] == 4 * 16
    assert whole["eval_duration"] > 0 and whole["eval_count"] / (whole["eval_duration"] / 1e9) < 5000, whole
    assert whole["prompt_eval_duration"] < whole["total_duration"]


@pytest.mark.parametrize("group", ["partial-late", "core"])
def test_the_openai_sdks_stream_helper_reads_a_parallel_groups_stream(groups_server, group):
    # choices open together in index order (the helper raised IndexError where index 1 came
    # first: a first member that failed, or a later one that wrote first)
    client = openai.OpenAI(base_url=groups_server.base + "/v1", api_key="x", max_retries=0)
    with client.chat.completions.stream(model=group, messages=Q, max_tokens=8, temperature=0) as stream:
        for _ in stream:
            pass
        final = stream.current_completion_snapshot  # (get_final_completion refuses a length cut)
    members = len(final.choices)
    assert members == (2 if group == "partial-late" else 3)
    answered = [c for c in final.choices if c.message.content]
    assert len(answered) == members - (group == "partial-late")
