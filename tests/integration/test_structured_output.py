"""Structured output through the real server: response_format json_object / json_schema and the
grammar field, on both models, greedy and sampled, with speculative decoding on (drafts are
verified under the grammar), streamed, fanned out, in groups, and refused with the field named."""

from __future__ import annotations

import concurrent.futures
import json
import re

import httpx
import pytest

from conftest import GEMMA3, SMOLLM2, model_entry
from opshelp import metric
from tool_requests import TOOLS, WEATHER, streamed_calls

MODELS = ["smollm2-135m", "gemma3-270m"]
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[A-Z][a-z]{0,19}( [A-Z][a-z]{0,19})?$"},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "city": {"type": "string", "maxLength": 30},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 2},
    },
    "required": ["name", "age", "city"],
    "additionalProperties": False,
}
ASK = "Give me a JSON object describing a person named Ann who is 31 and lives in Oslo."
PERSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON, "strict": True}}


def check_person(text: str) -> dict:
    obj = json.loads(text)  # strict: no control characters inside strings
    assert list(obj)[:3] == ["name", "age", "city"] and set(obj) <= {"name", "age", "city", "tags"}, obj
    assert re.fullmatch("[A-Z][a-z]{0,19}( [A-Z][a-z]{0,19})?", obj["name"]), obj
    assert isinstance(obj["age"], int) and 0 <= obj["age"] <= 120
    assert isinstance(obj["city"], str) and len(obj["city"]) <= 30
    assert set(obj.get("tags", [])) <= {"a", "b", "c"} and len(obj.get("tags", [])) <= 2
    assert text == text.strip(), repr(text)  # the output ends at the value
    return obj


@pytest.fixture(scope="module")
def server(server_factory):
    return server_factory(
        {
            "inference": {"speculative": {"sources": ["ngram", "history"]}},
            "models": [model_entry("smollm2-135m", SMOLLM2, n_parallel=4), model_entry("gemma3-270m", GEMMA3, n_parallel=2)],
            "groups": [
                {"name": "both", "models": MODELS, "type": "parallel"},
                {"name": "vote", "models": ["smollm2-135m"], "type": "fanout", "samples": 3},
                {"name": "chain", "models": ["gemma3-270m", "smollm2-135m"], "type": "sequential",
                 "prompt_templates": [None, "Describe this person as JSON: {input}"]},
            ],
        },
        "structured",
    )


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.base + path, json=body, timeout=300)


def chat(server, model: str, content: str = ASK, **kw) -> dict:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "temperature": 0, "max_tokens": 120, **kw}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def content(answer: dict, i: int = 0) -> str:
    return answer["choices"][i]["message"]["content"]


def spec_drafted(server, model: str) -> int:
    return httpx.get(server.base + "/v1/admin/scheduling/status").json()["models"][model]["speculative"]["drafted"]


@pytest.mark.parametrize("model", MODELS)
def test_json_schema_answers_follow_the_schema(server, model):
    for kw in ({}, {"temperature": 0.9, "seed": 7}, {"temperature": 1.3, "seed": 11, "top_p": 0.95}):
        answer = chat(server, model, response_format=PERSON_FORMAT, **kw)
        assert answer["choices"][0]["finish_reason"] == "stop", answer
        check_person(content(answer))
    plain = content(chat(server, model))
    with pytest.raises(ValueError):
        check_person(plain)  # unconstrained, the same request answers in prose


def test_json_object_gives_an_object_and_takes_llama_servers_schema_form(server):
    answer = chat(server, "smollm2-135m", 'Reply with the JSON object {"ok": true} and nothing else.',
                  response_format={"type": "json_object"}, max_tokens=200)
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert json.loads(content(answer)) == {"ok": True}
    answer = chat(server, "gemma3-270m", response_format={"type": "json_object", "schema": PERSON})
    check_person(content(answer))


@pytest.mark.parametrize("model", MODELS)
def test_drafts_are_verified_under_the_grammar_and_change_no_answer(server, model):
    """Greedy: the same answer with and without speculation. Sampled with a seed: the chain draws
    once per emitted position in order either way, so the same answer too."""
    prompt = ('Copy this JSON exactly: {"name": "Ann Berg", "age": 31, "city": "Oslo", "tags": ["a", "b"]}')
    before = spec_drafted(server, model)
    # plain greedy (argmax), sampled, greedy and sampled with penalties (the chain keeps state)
    for kw in ({}, {"temperature": 0.8, "seed": 5}, {"repeat_penalty": 1.3},
               {"temperature": 1.2, "seed": 9, "presence_penalty": 0.8, "top_k": 50}):
        on = content(chat(server, model, prompt, response_format=PERSON_FORMAT, **kw))
        off = content(chat(server, model, prompt, response_format=PERSON_FORMAT, speculative=False, **kw))
        assert on == off, kw
        check_person(on)
    assert spec_drafted(server, model) > before  # drafts were proposed (and checked) for these answers


def test_a_grammar_holds_for_every_sample_and_not_for_the_request_beside_it(server):
    """n=4 samples share one prefill (KV copies) but each has its own grammar state; a request
    running at the same time without a grammar answers as it does alone."""
    solo = content(chat(server, "smollm2-135m", "Name three colors.", max_tokens=40))
    grammar = 'root ::= ("yes" | "no" | "maybe") " because " [a-z ]{1,30} "."'
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        constrained = pool.submit(chat, server, "smollm2-135m", "Is the sky blue?", grammar=grammar, n=4,
                                  temperature=1.0, seed=3, max_tokens=60)
        beside = pool.submit(chat, server, "smollm2-135m", "Name three colors.", max_tokens=40)
        answer, other = constrained.result(), beside.result()

    for i in range(4):
        assert re.fullmatch(r"(yes|no|maybe) because [a-z ]{1,30}\.", content(answer, i)), content(answer, i)
        assert answer["choices"][i]["finish_reason"] == "stop"
    assert content(other) == solo


def test_streamed_and_completion_answers_follow_it_too(server):
    body = {"model": "gemma3-270m", "messages": [{"role": "user", "content": ASK}], "temperature": 0,
            "max_tokens": 120, "response_format": PERSON_FORMAT}
    whole = content(chat(server, **{k: v for k, v in body.items() if k not in ("messages",)}))
    parts = []
    with httpx.stream("POST", server.base + "/v1/chat/completions", json={**body, "stream": True}, timeout=300) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"]
                if delta and delta[0]["delta"].get("content"):
                    parts.append(delta[0]["delta"]["content"])
    assert "".join(parts) == whole
    check_person(whole)
    r = post(server, "/v1/completions", {"model": "smollm2-135m", "prompt": "The capital of France is",
                                         "grammar": 'root ::= " " [A-Z] [a-z]{1,12} "."', "max_tokens": 10,
                                         "temperature": 0})
    assert r.status_code == 200, r.text
    text = r.json()["choices"][0]["text"]
    assert text[0] == " " and text[1].isupper() and text.endswith(".") and text[2:-1].isalpha(), text


def test_groups_constrain_every_answer_and_a_chain_its_last(server):
    r = post(server, "/v1/batch/execute", {"group": "both", "messages": [{"role": "user", "content": ASK}],
                                           "temperature": 0, "max_tokens": 120, "response_format": PERSON_FORMAT})
    assert r.status_code == 200, r.text
    members = r.json()["members"]
    assert len(members) == 2
    for m in members:
        assert m["status"] == "ok" and m["finish_reason"] == "stop", m
        check_person(m["text"])
    r = post(server, "/v1/batch/execute", {"group": "vote", "messages": [{"role": "user", "content": "Is water wet?"}],
                                           "temperature": 1.0, "seed": 1, "max_tokens": 5,
                                           "grammar": 'root ::= "yes" | "no"'})
    assert r.status_code == 200, r.text
    out = r.json()
    assert {m["text"] for m in out["members"]} <= {"yes", "no"} and out["output"] in ("yes", "no")
    r = post(server, "/v1/chain/execute", {"group": "chain", "temperature": 0, "max_tokens": 60,
                                           "messages": [{"role": "user", "content": "Who is Ann (31, Oslo)?"}],
                                           "response_format": PERSON_FORMAT})
    assert r.status_code == 200, r.text
    first, last = r.json()["members"]
    assert first["status"] == last["status"] == "ok"
    with pytest.raises(ValueError):
        json.loads(first["text"])  # the first member answers freely
    check_person(r.json()["output"])


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "z", "schema": {
        "type": "object", "properties": {"zip": {"type": "string", "pattern": "^(?!0)[0-9]{5}$"}}}}}},
     "response_format.json_schema.schema.properties.zip.pattern"),
    ({"response_format": {"type": "json_object", "schema": {"type": "number", "maximum": 3}}},
     "response_format.schema.maximum"),
    ({"grammar": "root ::= undefined-rule"}, "grammar"),
    ({"grammar": 'root ::= "a"', "response_format": {"type": "json_object"}}, "grammar"),
    ({"grammar": ""}, "grammar"),
])
def test_bad_formats_and_grammars_are_refused_by_field(server, body, param):
    for path, base in (("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                       ("/v1/completions", {"prompt": "hi"})):
        r = post(server, path, {"model": "smollm2-135m", **base, **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param, r.text
    r = post(server, "/v1/batch/execute", {"group": "both", "messages": [{"role": "user", "content": "hi"}], **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_token_named_by_text_is_per_model_so_groups_refuse_it(server):
    r = post(server, "/v1/batch/execute", {"group": "both", "messages": [{"role": "user", "content": "hi"}],
                                           "grammar": "root ::= <|im_end|>"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "grammar", r.text


def test_constrained_sequences_are_counted(server):
    before = metric(httpx.get(server.base + "/metrics").text, "eie_grammar_sequences_total", model="gemma3-270m")
    chat(server, "gemma3-270m", response_format=PERSON_FORMAT, max_tokens=40)
    after = metric(httpx.get(server.base + "/metrics").text, "eie_grammar_sequences_total", model="gemma3-270m")
    assert after == before + 1
    assert httpx.get(server.base + "/health").status_code == 200


def test_a_grammar_that_no_token_can_continue_ends_the_answer(server):
    """Tokens whose text starts with a NUL byte are never allowed, so after "ok" nothing is: the
    answer ends there (counted), instead of a token the grammar refused."""
    dead_ends = lambda: metric(httpx.get(server.base + "/metrics").text, "eie_grammar_dead_ends_total",  # noqa: E731
                               model="smollm2-135m")
    before = dead_ends()
    answer = chat(server, "smollm2-135m", "Say ok.", grammar='root ::= "ok" "\\x00"', max_tokens=10)
    assert content(answer) == "ok" and answer["choices"][0]["finish_reason"] == "stop"
    assert dead_ends() == before + 1


# ---- tools --------------------------------------------------------------------------------------

def tool_chat(server, model: str, messages: list, **kw) -> dict:
    r = post(server, "/v1/chat/completions", {"model": model, "messages": messages, "tools": TOOLS,
                                              "temperature": 0, "max_tokens": 80, **kw})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def check_call(call: dict) -> dict:
    assert call["type"] == "function" and call["id"].startswith("call_")
    args = json.loads(call["function"]["arguments"])
    if call["function"]["name"] == "add":
        assert set(args) == {"a", "b"} and all(isinstance(v, int) for v in args.values()), args
    else:
        assert call["function"]["name"] == "get_weather", call
        assert list(args) == ["city", "unit"] and args["unit"] in ("celsius", "fahrenheit"), args
    return args


@pytest.mark.parametrize("model", MODELS)
def test_a_named_or_required_tool_is_called_with_arguments_that_fit_its_schema(server, model):
    choice = tool_chat(server, model, WEATHER, tool_choice={"type": "function", "function": {"name": "add"}})
    assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
    (call,) = choice["message"]["tool_calls"]
    assert call["function"]["name"] == "add"
    check_call(call)
    choice = tool_chat(server, model, WEATHER, tool_choice="required", parallel_tool_calls=False)
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    check_call(call)


def test_stop_strings_do_not_cut_what_a_grammar_holds(server):
    # a stop string inside a tool call or a JSON answer ended it there: the call's envelope came
    # back as content ("{") with finish_reason stop, and the JSON did not parse
    choice = tool_chat(server, "smollm2-135m", WEATHER, tool_choice="required", parallel_tool_calls=False,
                       stop=["\n", ",", '"'])
    assert choice["finish_reason"] == "tool_calls", choice
    check_call(choice["message"]["tool_calls"][0])
    answer = chat(server, "smollm2-135m", response_format=PERSON_FORMAT, stop=["}", ",", "\n"])
    assert answer["choices"][0]["finish_reason"] == "stop"
    check_person(content(answer))
    # without a grammar the same stops cut the text as ever
    plain = chat(server, "smollm2-135m", stop=[" "])
    assert " " not in content(plain) and plain["choices"][0]["finish_reason"] == "stop"


def test_auto_answers_or_calls_and_none_answers_as_without_tools(server):
    for model in MODELS:
        choice = tool_chat(server, model, WEATHER, parallel_tool_calls=False, max_tokens=150)
        if choice["finish_reason"] == "tool_calls":
            for call in choice["message"]["tool_calls"]:
                check_call(call)
        else:  # a direct answer: the text of {"response": "..."}, also when max_tokens cut it
            assert choice["finish_reason"] in ("stop", "length") and "tool_calls" not in choice["message"]
            assert choice["message"]["content"] and not choice["message"]["content"].lstrip().startswith("{")
        plain = post(server, "/v1/chat/completions", {"model": model, "messages": WEATHER, "temperature": 0,
                                                      "max_tokens": 30}).json()["choices"][0]["message"]["content"]
        none = tool_chat(server, model, WEATHER, tool_choice="none", max_tokens=30)
        assert none["message"]["content"] == plain  # no instructions, no grammar


def test_a_streamed_tool_call_goes_out_in_pieces_that_add_up_to_the_whole_call(server):
    body = {"model": "gemma3-270m", "messages": WEATHER, "tools": TOOLS, "temperature": 0, "max_tokens": 80,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    whole = post(server, "/v1/chat/completions", body).json()["choices"][0]
    chunks = []
    with httpx.stream("POST", server.base + "/v1/chat/completions", json={**body, "stream": True}, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:])["choices"][0])
    assert chunks[0]["delta"]["role"] == "assistant"
    assert chunks[-1]["finish_reason"] == "tool_calls"
    pieces = [p for c in chunks for p in c["delta"].get("tool_calls") or []]
    (call,) = streamed_calls(chunks)
    assert call["function"] == whole["message"]["tool_calls"][0]["function"]
    assert len(pieces) > 1 and len(pieces[0]["function"]["arguments"]) < len(call["function"]["arguments"])
    check_call(call)


def test_a_streamed_call_cut_short_ends_as_a_call_with_its_arguments_so_far(server):
    body = {"model": "gemma3-270m", "messages": WEATHER, "tools": TOOLS, "temperature": 0, "max_tokens": 18,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    whole = post(server, "/v1/chat/completions", {**body, "max_tokens": 80}).json()["choices"][0]
    arguments = whole["message"]["tool_calls"][0]["function"]["arguments"]
    chunks = []
    with httpx.stream("POST", server.base + "/v1/chat/completions", json={**body, "stream": True}, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:])["choices"][0])
    (call,) = streamed_calls(chunks)  # as OpenAI's streams end: the call as far as it was written
    assert chunks[-1]["finish_reason"] == "length" and call["function"]["name"] == "get_weather"
    assert arguments.startswith(call["function"]["arguments"]) and call["function"]["arguments"] != arguments
    assert not any(c["delta"].get("content") for c in chunks)
    cut = post(server, "/v1/chat/completions", body).json()["choices"][0]  # read whole: the text as it is
    assert cut["finish_reason"] == "length" and "tool_calls" not in cut["message"]
    assert '"get_weather"' in cut["message"]["content"]


@pytest.mark.parametrize("model", MODELS)
def test_a_conversation_with_tool_results_renders_for_every_template(server, model):
    """Gemma 3's template only takes alternating user and model turns: the tool turns are written
    as an assistant's JSON and a user's results."""
    messages = [*WEATHER,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}},
                    {"id": "call_2", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
                {"role": "tool", "tool_call_id": "call_2", "content": "3"}]
    for kw in ({"tool_choice": "none"}, {}):
        choice = tool_chat(server, model, messages, **kw)
        assert choice["finish_reason"] in ("stop", "tool_calls", "length")
        assert choice["message"]["content"] or choice["message"].get("tool_calls")


@pytest.mark.parametrize("change,param", [
    ({"tools": [{"type": "retrieval", "function": {"name": "x"}}]}, "tools[0].type"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": TOOLS + [TOOLS[1]]}, "tools[2].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "(?=a)a+"}}}}}]},
     "tools[0].function.parameters.properties.x.pattern"),
    ({"tool_choice": {"type": "function", "function": {"name": "missing"}}}, "tool_choice.function.name"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": None, "tool_choice": "required"}, "tool_choice"),
    ({"grammar": 'root ::= "a" undefined-rule'}, "grammar"),  # the grammar's fault, not the tools'
])
def test_bad_tools_are_refused_by_field(server, change, param):
    body = {"model": "smollm2-135m", "messages": WEATHER, "tools": TOOLS, **change}
    r = post(server, "/v1/chat/completions", {k: v for k, v in body.items() if v is not None})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_logprobs_cover_every_token_of_a_call_streamed_or_whole(server):
    """With tools, logprobs cover the answer's tokens, the call's included: their text is the
    call as the model wrote it, and a stream carries the same entries as the whole answer."""
    body = {"model": "gemma3-270m", "messages": WEATHER, "tools": TOOLS, "temperature": 0, "max_tokens": 80,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "logprobs": True,
            "top_logprobs": 2}
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    whole = r.json()
    choice = whole["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    (call,) = choice["message"]["tool_calls"]
    entries = choice["logprobs"]["content"]
    assert len(entries) == whole["usage"]["completion_tokens"]
    assert all(len(e["top_logprobs"]) == 2 and e["logprob"] <= 0 for e in entries), entries
    written = json.loads("".join(e["token"] for e in entries))  # EIE's call format
    assert written["tool_calls"][0]["name"] == "get_weather"
    assert written["tool_calls"][0]["arguments"] == json.loads(call["function"]["arguments"])
    streamed = []
    with httpx.stream("POST", server.base + "/v1/chat/completions", json={**body, "stream": True}, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                piece = json.loads(line[6:])["choices"][0]
                streamed += (piece.get("logprobs") or {}).get("content") or []
    assert [e["token"] for e in streamed] == [e["token"] for e in entries]
    assert [e["logprob"] for e in streamed] == pytest.approx([e["logprob"] for e in entries], abs=1e-3)
    # the Responses API: logprobs belong to output text, and a call is no text
    r = post(server, "/v1/responses", {"model": "gemma3-270m", "input": WEATHER[-1]["content"], "temperature": 0,
                                       "tools": [{"type": "function", **TOOLS[0]["function"]}],
                                       "tool_choice": "required", "parallel_tool_calls": False,
                                       "include": ["message.output_text.logprobs"],
                                       "max_output_tokens": 80})
    assert r.status_code == 200, r.text
    assert [item["type"] for item in r.json()["output"]] == ["function_call"], r.text


FUNCTIONS = [tool["function"] for tool in TOOLS]


def test_legacy_functions_are_served_as_one_tool_call_in_their_own_shape(server):
    """OpenAI's deprecated functions/function_call: the answer's call is message.function_call
    (finish_reason function_call), streamed as delta.function_call pieces; the answer is the one
    the same request in tools gets."""
    body = {"model": "gemma3-270m", "messages": WEATHER, "temperature": 0, "max_tokens": 80}
    legacy = post(server, "/v1/chat/completions", {**body, "functions": FUNCTIONS,
                                                   "function_call": {"name": "get_weather"}}).json()["choices"][0]
    assert legacy["finish_reason"] == "function_call" and legacy["message"]["content"] is None, legacy
    assert "tool_calls" not in legacy["message"]
    call = legacy["message"]["function_call"]
    assert set(call) == {"name", "arguments"} and call["name"] == "get_weather"
    check_call({"type": "function", "id": "call_x", "function": call})
    modern = tool_chat(server, "gemma3-270m", WEATHER, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                       parallel_tool_calls=False)
    assert modern["message"]["tool_calls"][0]["function"] == call
    pieces, reasons = [], []
    with httpx.stream("POST", server.base + "/v1/chat/completions", timeout=300,
                      json={**body, "functions": FUNCTIONS, "function_call": {"name": "get_weather"}, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                assert "tool_calls" not in choice["delta"]
                if "function_call" in choice["delta"]:
                    pieces.append(choice["delta"]["function_call"])
                reasons.append(choice["finish_reason"])
    assert reasons[-1] == "function_call" and pieces[0]["name"] == "get_weather"
    assert len(pieces) > 1 and all("name" not in p for p in pieces[1:])
    assert "".join(p["arguments"] for p in pieces) == call["arguments"]
    # auto: a call or a direct answer, never more than one call
    auto = post(server, "/v1/chat/completions", {**body, "functions": FUNCTIONS}).json()["choices"][0]
    assert auto["finish_reason"] in ("function_call", "stop", "length") and "tool_calls" not in auto["message"]


def test_a_legacy_history_renders_as_the_tool_history_it_stands_for(server):
    """An assistant's function_call and the function message answering it are the tool call and
    tool message (by name: the legacy form has no ids) they stand for: the same prompt, the same answer."""
    ask = {"role": "user", "content": "What is 2 plus 3?"}
    legacy = [ask, {"role": "assistant", "content": None, "function_call": {"name": "add", "arguments": '{"a": 2, "b": 3}'}},
              {"role": "function", "name": "add", "content": "5"}]
    modern = [ask, {"role": "assistant", "content": None,
                    "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
              {"role": "tool", "name": "add", "content": "5"}]
    for model in MODELS:
        body = {"model": model, "temperature": 0, "max_tokens": 30}
        old = post(server, "/v1/chat/completions", {**body, "messages": legacy, "functions": FUNCTIONS,
                                                    "function_call": "none"})
        new = post(server, "/v1/chat/completions", {**body, "messages": modern, "tools": TOOLS, "tool_choice": "none"})
        assert old.status_code == new.status_code == 200, old.text
        assert old.json()["usage"]["prompt_tokens"] == new.json()["usage"]["prompt_tokens"]
        assert old.json()["choices"][0]["message"]["content"] == new.json()["choices"][0]["message"]["content"]
        assert "5" in post(server, "/apply-template", {"model": model, "messages": legacy}).json()["prompt"]
    r = post(server, "/v1/chat/completions", {"model": "both", "messages": WEATHER, "functions": FUNCTIONS})
    assert r.status_code == 400 and r.json()["error"]["param"] == "functions", r.text


def test_a_streamed_direct_answer_goes_out_as_it_is_written(server):
    """auto: SmolLM2 answers this one directly; its {"response": ...} JSON streams as plain text."""
    body = {"model": "smollm2-135m", "messages": WEATHER, "tools": TOOLS, "temperature": 0, "max_tokens": 80,
            "parallel_tool_calls": False, "speculative": False}  # a token a step: as many chunks as tokens
    whole = post(server, "/v1/chat/completions", body).json()["choices"][0]
    assert whole["finish_reason"] == "stop" and whole["message"]["content"], whole
    parts = []
    with httpx.stream("POST", server.base + "/v1/chat/completions", json={**body, "stream": True}, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                assert "tool_calls" not in delta
                if delta.get("content"):
                    parts.append(delta["content"])
    assert "".join(parts) == whole["message"]["content"] and len(parts) > 5


def _first_key_token(server, model: str, key: str) -> int:
    """The token that starts `key` in an object's first key, as the grammar lets the model write it."""
    ids = [t["id"] for t in post(server, "/tokenize", {"model": model, "content": '{"' + key,
                                                       "with_pieces": True}).json()["tokens"]]
    base = [t["id"] for t in post(server, "/tokenize", {"model": model, "content": '{"',
                                                        "with_pieces": True}).json()["tokens"]]
    assert ids[:len(base)] == base, (ids, base)
    return ids[len(base)]


def streamed_reply(server, body: dict) -> list[str]:
    """The content pieces of a streamed direct answer, a token a step (no drafts: as many chunks
    as tokens); no piece is a tool call."""
    parts = []
    with httpx.stream("POST", server.base + "/v1/chat/completions",
                      json={**body, "stream": True, "speculative": False}, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                assert "tool_calls" not in delta
                parts.append(delta.get("content") or "")
    return parts


@pytest.mark.parametrize("model", MODELS)
def test_tools_with_a_response_format_answer_in_that_format_or_call(server, model):
    """Under auto, a direct answer is the JSON the response_format asks for (not {"response": ...}),
    streamed as it is written; a call is a call. The model is pushed one way, then the other."""
    tool = str(_first_key_token(server, model, "tool_calls"))
    body = {"model": model, "messages": [{"role": "user", "content": ASK}], "tools": TOOLS, "temperature": 0,
            "max_tokens": 80, "response_format": PERSON_FORMAT, "parallel_tool_calls": False}
    replied = post(server, "/v1/chat/completions", {**body, "logit_bias": {tool: -100}}).json()["choices"][0]
    assert replied["finish_reason"] == "stop" and "tool_calls" not in replied["message"], replied
    check_person(replied["message"]["content"])
    parts = streamed_reply(server, {**body, "logit_bias": {tool: -100}})
    assert "".join(parts) == replied["message"]["content"] and len([p for p in parts if p]) > 3
    called = post(server, "/v1/chat/completions", {**body, "logit_bias": {tool: 100}}).json()["choices"][0]
    assert called["finish_reason"] == "tool_calls" and called["message"]["content"] is None, called
    (call,) = called["message"]["tool_calls"]
    check_call(call)
    # required: a call, the format being for a later turn
    required = post(server, "/v1/chat/completions", {**body, "tool_choice": "required"}).json()["choices"][0]
    assert required["finish_reason"] == "tool_calls"


VERDICT = '# a verdict, then why\nroot ::= verdict ", because " why "."\nverdict ::= "Yes" | "No"\nwhy ::= [a-z ]{1,40}\n'


@pytest.mark.parametrize("model", MODELS)
def test_tools_with_a_grammar_answer_in_that_grammar_or_call(server, model):
    """`grammar` with tools, as response_format with tools: under auto a direct answer follows the
    request's grammar and streams as written; a call is a call; a grammar that does not compile is
    refused by its own field, not as the tools'."""
    tool = str(_first_key_token(server, model, "tool_calls"))

    def first(text: str) -> str:
        tokens = post(server, "/tokenize", {"model": model, "content": text, "add_special": False}).json()["tokens"]
        return str(tokens[0])

    yes = first("Yes")
    body = {"model": model, "messages": WEATHER, "tools": TOOLS, "temperature": 0, "max_tokens": 60,
            "grammar": VERDICT, "parallel_tool_calls": False}
    replied = post(server, "/v1/chat/completions", {**body, "logit_bias": {yes: 100}}).json()["choices"][0]
    assert replied["finish_reason"] == "stop" and "tool_calls" not in replied["message"], replied
    assert re.fullmatch(r"(Yes|No), because [a-z ]{1,40}\.", replied["message"]["content"]), replied
    parts = streamed_reply(server, {**body, "logit_bias": {yes: 100}})
    assert "".join(parts) == replied["message"]["content"] and len([p for p in parts if p]) > 3
    called = post(server, "/v1/chat/completions", {**body, "logit_bias": {first('{"'): 100, tool: 100}}).json()["choices"][0]
    assert called["finish_reason"] == "tool_calls" and called["message"]["content"] is None, called
    check_call(called["message"]["tool_calls"][0])
    required = post(server, "/v1/chat/completions", {**body, "tool_choice": "required"}).json()["choices"][0]
    assert required["finish_reason"] == "tool_calls"
    for choice in ("auto", "required"):  # under required it is for a later turn, and still checked
        bad = post(server, "/v1/chat/completions", {**body, "grammar": "root ::= verdict", "tool_choice": choice})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "grammar", bad.text
