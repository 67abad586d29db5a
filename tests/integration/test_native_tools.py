"""Tool calls in a model's own format (api/native_tools.py), through the real server: SmolLM2
copies whose vocabularies have `<tool_call>` (Hermes, Qwen) or `[TOOL_CALLS]`, `[ARGS]` and
`[CALL_ID]` (Mistral) as single tokens, and plain SmolLM2 with a Llama 3.x template, each served
with a template in its family's form (tests/native_tool_models.py). The template lists the
tools, the answer is held by a grammar to the format (lazy under `auto` where it opens with a
token), and history renders as the template writes it. The Hermes template on SmolLM2 as it is
(no such token) falls back to EIE's JSON format."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from conftest import SMOLLM2, model_entry
from appliance.api.native_tools import mistral_id
from native_tool_models import (APERTUS_TEMPLATE, APERTUS_TOKENS, APRIEL_TEMPLATE, DEEPSEEK_R1_TEMPLATE, COMMAND_R_TEMPLATE, GIGACHAT_TEMPLATE, GIGACHAT_TOKENS, KIMI_TEMPLATE, KIMI_TOKENS, MINIMAX_TEMPLATE, MINIMAX_TOKENS, SEED_OSS_TEMPLATE, SEED_OSS_TOKENS, COMMAND_R_TOKENS, FUNCTIONGEMMA_TEMPLATE, FUNCTIONGEMMA_TOKENS,
                                GEMMA4_TEMPLATE, GEMMA4_TOKENS, GLM_TEMPLATE, GPT_OSS_TEMPLATE, GRANITE_TEMPLATE,
                                GRANITE_TOKENS, HERMES_TEMPLATE, LFM2_TEMPLATE, LFM2_TOKENS, LLAMA3_TEMPLATE, LLAMA3_TOKENS, MINICPM5_TEMPLATE,
                                MISTRAL_ARGS_TEMPLATE, MISTRAL_TEMPLATE, MISTRAL_TOKENS, NEMOTRON_TEMPLATE,
                                NEMOTRON_TOKENS, QWEN3_CODER_TEMPLATE, TOOL_CALL_TOKEN, write_control_smollm2,
                                write_hermes_smollm2)
from reasoning_templates import HARMONY_TOKENS
from tool_requests import TOOLS, WEATHER, streamed_calls

CALL_FIRST = {str(TOOL_CALL_TOKEN): 100}  # under auto the untrained model is made to open a call


# The models served from a SmolLM2 copy whose tags are control tokens: name, tokens, template.
CONTROL_COPIES = [("mistral", MISTRAL_TOKENS, MISTRAL_TEMPLATE), ("lfm2", LFM2_TOKENS, LFM2_TEMPLATE),
                  ("gpt-oss", HARMONY_TOKENS, GPT_OSS_TEMPLATE), ("granite", GRANITE_TOKENS, GRANITE_TEMPLATE),
                  ("nemotron", NEMOTRON_TOKENS, NEMOTRON_TEMPLATE), ("command-r", COMMAND_R_TOKENS, COMMAND_R_TEMPLATE),
                  ("apertus", APERTUS_TOKENS, APERTUS_TEMPLATE), ("gigachat", GIGACHAT_TOKENS, GIGACHAT_TEMPLATE),
                  ("seed-oss", SEED_OSS_TOKENS, SEED_OSS_TEMPLATE), ("kimi-k2", KIMI_TOKENS, KIMI_TEMPLATE),
                  ("gemma4", GEMMA4_TOKENS, GEMMA4_TEMPLATE),
                  ("functiongemma", FUNCTIONGEMMA_TOKENS, FUNCTIONGEMMA_TEMPLATE),
                  ("llama3-tag", LLAMA3_TOKENS, LLAMA3_TEMPLATE), ("minimax", MINIMAX_TOKENS, MINIMAX_TEMPLATE)]

# Copies that speculate as the others do. Speculation leaves greedy answers as they are; what it
# could break is a grammar that holds a call, the same code for every format. A copy is a file of
# its own, whose exactness probe (about 3.5 s on 2 cores) runs at its first load, so the rest do
# without it.
SPECULATING_COPIES = {"mistral", "gpt-oss", "minimax"}
NO_SPECULATION = {"speculative": {"sources": []}}
# The copies (each its own file) keep K as it is: K centring measures each new file's K means at
# its first load (2-4 s each here), and it changes no tool format; the models on SmolLM2's and
# the Hermes file keep it (SmolLM2's greedy answers, which some tests read, are its own with it).
UNCENTRED = {"center_k": False}


@pytest.fixture(scope="module")
def server(server_factory, tmp_path_factory):
    hermes = write_hermes_smollm2(tmp_path_factory.mktemp("hermes") / "smollm2-hermes.gguf")
    models = tmp_path_factory.mktemp("tokened")
    copies = {name: write_control_smollm2(models / f"smollm2-{name}.gguf", tokens) for name, tokens, _ in CONTROL_COPIES}
    return server_factory({
        "inference": {"speculative": {"sources": ["ngram", "history"]}},
        "models": [model_entry("hermes", hermes, n_parallel=2, chat_template=HERMES_TEMPLATE),
                   model_entry("no-tag", SMOLLM2, n_parallel=1, chat_template=HERMES_TEMPLATE),
                   *(model_entry(name, copies[name], n_parallel=1, chat_template=template,
                                 # its think block, which the prompt opens, closed at once
                                 **({"reasoning_budget": 0} if name == "minimax" else {}),
                                 **({} if name in SPECULATING_COPIES else NO_SPECULATION), kv_cache=UNCENTRED)
                     for name, _, template in CONTROL_COPIES),
                   model_entry("mistral-args", copies["mistral"], n_parallel=1, chat_template=MISTRAL_ARGS_TEMPLATE,
                               kv_cache=UNCENTRED),
                   # as its tagged copy (llama3-tag), whose answers are compared with its own
                   model_entry("llama3", SMOLLM2, n_parallel=1, chat_template=LLAMA3_TEMPLATE, kv_cache=UNCENTRED,
                               **NO_SPECULATION),
                   model_entry("qwen3-coder", hermes, n_parallel=1, chat_template=QWEN3_CODER_TEMPLATE),
                   model_entry("glm", hermes, n_parallel=1, chat_template=GLM_TEMPLATE),
                   model_entry("minicpm5", SMOLLM2, n_parallel=1, chat_template=MINICPM5_TEMPLATE),
                   # its think block, which the prompt opens, closed at once; its tags are text here
                   model_entry("deepseek-r1", SMOLLM2, n_parallel=1, chat_template=DEEPSEEK_R1_TEMPLATE,
                               reasoning_budget=0),
                   # its reasoning, which the prompt opens, closed at once (SmolLM2 would not close it)
                   model_entry("apriel", SMOLLM2, n_parallel=1, chat_template=APRIEL_TEMPLATE, reasoning_budget=0)],
    }, "native-tools")


def chat(server, messages: list, model: str = "hermes", **kw) -> httpx.Response:
    return httpx.post(server.base + "/v1/chat/completions", timeout=300, json={
        "model": model, "messages": messages, "tools": TOOLS, "temperature": 0, "max_tokens": 80, **kw})


def tokens(server, model: str = "hermes", **body) -> dict:
    r = httpx.post(server.base + "/tokenize", json={"model": model, "with_pieces": True, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def prompt_text(server, model: str = "hermes", **body) -> str:
    """The chat's prompt as text (llama-server's /apply-template: the text /tokenize tokenizes;
    its pieces one by one would cut DeepSeek's full-width tags apart)."""
    r = httpx.post(server.base + "/apply-template", json={"model": model, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def check_weather(call: dict, model: str = "hermes") -> None:
    assert call["type"] == "function"
    if model.startswith("mistral"):
        assert re.fullmatch("[a-zA-Z0-9]{9}", call["id"]), call["id"]  # the only ids Mistral's templates take
    elif model == "kimi-k2":
        assert re.fullmatch(r"functions\.get_weather:\d+", call["id"]), call["id"]  # the id the model wrote
    else:
        assert call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    args = json.loads(call["function"]["arguments"])
    assert list(args) == ["city", "unit"] and args["unit"] in ("celsius", "fahrenheit"), args


def test_the_template_lists_the_tools_and_the_prompt_is_what_the_chat_renders(server):
    text = prompt_text(server, messages=WEATHER, tools=TOOLS)
    assert text.startswith("<|im_start|>system\nYou can call functions.")
    for tool in TOOLS:
        assert json.dumps(tool, ensure_ascii=False) + "\n" in text  # tojson as Hugging Face writes it
    assert "Reply with one JSON object" not in text  # not EIE's instructions
    r = chat(server, WEATHER, tool_choice="required", max_tokens=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == tokens(server, messages=WEATHER, tools=TOOLS)["count"]


def test_required_and_named_calls_come_in_the_models_format(server):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        r = chat(server, WEATHER, tool_choice=choice, parallel_tool_calls=False)
        assert r.status_code == 200, r.text
        out = r.json()["choices"][0]
        assert out["finish_reason"] == "tool_calls" and out["message"]["content"] is None, out
        (call,) = out["message"]["tool_calls"]
        if choice != "required":
            check_weather(call)
        else:
            assert call["function"]["name"] in ("get_weather", "add")
            json.loads(call["function"]["arguments"])


def test_auto_is_free_until_the_model_opens_a_call(server):
    """Without the tag the answer is the model's text, the same as with no grammar at all; once
    the model picks `<tool_call>` the rest is held to the call's grammar."""
    free = chat(server, WEATHER, max_tokens=30).json()["choices"][0]
    assert free["finish_reason"] in ("stop", "length") and "tool_calls" not in free["message"]
    # the grammar is lazy: until the tag, the answer is what the prompt alone gives
    prompt = [t["id"] for t in tokens(server, messages=WEATHER, tools=TOOLS)["tokens"]]
    same = httpx.post(server.base + "/v1/completions", timeout=300, json={
        "model": "hermes", "prompt": prompt, "temperature": 0, "max_tokens": 30}).json()["choices"][0]["text"]
    assert free["message"]["content"] == same
    # `add` only: its call has no free string, where the tag (pushed up everywhere) is valid text
    called = chat(server, WEATHER, tools=[TOOLS[1]], logit_bias=CALL_FIRST, parallel_tool_calls=False)
    out = called.json()["choices"][0]
    assert out["finish_reason"] == "tool_calls" and out["message"]["content"] is None, out
    (call,) = out["message"]["tool_calls"]
    assert call["function"]["name"] == "add"
    assert {k: type(v) for k, v in json.loads(call["function"]["arguments"]).items()} == {"a": int, "b": int}


def test_a_streamed_call_goes_out_as_it_is_written_and_no_tag_leaks_into_the_content(server):
    body = {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "max_tokens": 80}
    whole = chat(server, WEATHER, **body).json()["choices"][0]
    chunks = []
    with httpx.stream("POST", server.base + "/v1/chat/completions", timeout=300, json={
            "model": "hermes", "messages": WEATHER, "tools": TOOLS, "temperature": 0, "stream": True, **body}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:])["choices"][0])
    pieces = [p for c in chunks for p in c["delta"].get("tool_calls") or []]
    assert chunks[-1]["finish_reason"] == "tool_calls"
    (call,) = streamed_calls(chunks)
    assert call["function"] == whole["message"]["tool_calls"][0]["function"]
    # named before its arguments were whole (a step may accept several drafted tokens at once)
    assert len(pieces) > 1 and len(pieces[0]["function"]["arguments"]) < len(call["function"]["arguments"])
    check_weather(call)
    assert not any("<tool_call>" in (c["delta"].get("content") or "") for c in chunks)


def test_history_renders_as_the_template_writes_calls_and_results(server):
    messages = [*WEATHER,
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]
    text = prompt_text(server, messages=messages, tools=TOOLS)
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris", "unit": "celsius"}}\n</tool_call>\n<|im_end|>') in text
    assert "<|im_start|>user\n<tool_response>\n18 degrees, sunny\n</tool_response><|im_end|>" in text
    r = chat(server, messages, tool_choice="none", max_tokens=20)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"], r.text


def test_a_vocabulary_without_the_tag_takes_it_as_text(server):
    """A Hermes template on a vocabulary that spells `<tool_call>` in several tokens (a fine-tune
    of another base): the same format, the grammar started by the tag's text."""
    r = chat(server, WEATHER, model="no-tag", tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.status_code == 200, r.text
    out = r.json()["choices"][0]
    assert out["finish_reason"] == "tool_calls" and out["message"]["content"] is None, out
    check_weather(out["message"]["tool_calls"][0])
    assert "<tool_call>" in prompt_text(server, "no-tag", messages=WEATHER, tools=TOOLS)
    # under auto the grammar waits for the tag's text (test_under_auto_a_call_is_held_from_its_tag_written_as_text)


def test_tools_in_tokenize_need_messages(server):
    r = httpx.post(server.base + "/tokenize", json={"model": "hermes", "content": "x", "tools": TOOLS})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools"


def test_the_model_list_names_each_models_tool_format(server):
    cards = {c["id"]: c["tool_format"] for c in httpx.get(server.base + "/v1/models").json()["data"]}
    assert cards == {"hermes": "hermes", "no-tag": "hermes", "mistral": "mistral", "mistral-args": "mistral-args",
                     "llama3": "llama3", "qwen3-coder": "qwen3-coder", "glm": "glm", "minicpm5": "minicpm5", "lfm2": "lfm2", "gpt-oss": "harmony", "granite": "granite", "nemotron": "nemotron", "command-r": "command-r", "apertus": "apertus", "apriel": "apriel", "gigachat": "gigachat", "seed-oss": "seed-oss", "kimi-k2": "kimi-k2",
                     "minimax": "minimax", "deepseek-r1": "deepseek-r1", "gemma4": "gemma4",
                     "functiongemma": "functiongemma", "llama3-tag": "llama3"}


OTHER_FORMATS = ("mistral", "mistral-args", "llama3", "qwen3-coder", "glm", "minicpm5", "lfm2", "gpt-oss", "granite", "nemotron",
                 "command-r", "apertus", "apriel", "gigachat", "seed-oss", "kimi-k2", "deepseek-r1", "gemma4",
                 "functiongemma", "minimax")
HISTORY = [*WEATHER,
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}]


@pytest.mark.parametrize("model", OTHER_FORMATS)
def test_a_named_call_comes_in_each_models_format(server, model):
    # room for tags that are text (DeepSeek's are dozens of tokens in SmolLM2's vocabulary); a call ends the answer
    whole = chat(server, WEATHER, model=model, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                 max_tokens=240)
    assert whole.status_code == 200, whole.text
    out = whole.json()["choices"][0]
    assert out["finish_reason"] == "tool_calls" and out["message"]["content"] is None, out
    (call,) = out["message"]["tool_calls"]
    check_weather(call, model)
    chunks = []  # streamed: the same call, and no tag in the content
    with httpx.stream("POST", server.base + "/v1/chat/completions", timeout=300, json={
            "model": model, "messages": WEATHER, "tools": TOOLS, "temperature": 0, "stream": True, "max_tokens": 240,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:])["choices"][0])
    (streamed,) = streamed_calls(chunks)
    assert streamed["function"] == call["function"]
    assert not "".join(c["delta"].get("content") or "" for c in chunks).strip()


@pytest.mark.parametrize("model", ("mistral", "mistral-args"))
def test_mistral_under_auto_calls_once_the_model_writes_its_tag(server, model):
    called = chat(server, WEATHER, model=model, tools=[TOOLS[1]], logit_bias={"8": 100},  # [TOOL_CALLS]
                  parallel_tool_calls=False)
    out = called.json()["choices"][0]
    assert out["finish_reason"] == "tool_calls", out
    assert all(c["function"]["name"] == "add" for c in out["message"]["tool_calls"])
    assert "[TOOL_CALLS]" not in (out["message"]["content"] or "")


def test_minimax_under_auto_calls_after_its_think_block_once_the_model_writes_its_tag(server):
    called = chat(server, WEATHER, model="minimax", tools=[TOOLS[1]], logit_bias={"9": 100},  # <minimax:tool_call>
                  parallel_tool_calls=False)
    out = called.json()["choices"][0]
    assert out["finish_reason"] == "tool_calls", out
    (call,) = out["message"]["tool_calls"]
    assert call["function"]["name"] == "add" and set(json.loads(call["function"]["arguments"])) == {"a", "b"}
    assert "minimax" not in (out["message"]["content"] or "") and not out["message"].get("reasoning_content")


def test_llama3_under_auto_answers_text_or_a_call_from_its_first_character(server):
    free = chat(server, WEATHER, model="llama3", max_tokens=30).json()["choices"][0]
    prompt = [t["id"] for t in tokens(server, "llama3", messages=WEATHER, tools=TOOLS)["tokens"]]
    same = httpx.post(server.base + "/v1/completions", timeout=300, json={
        "model": "llama3", "prompt": prompt, "temperature": 0, "max_tokens": 30}).json()["choices"][0]["text"]
    assert not same.lstrip().startswith("{") and free["message"]["content"] == same  # text passes untouched
    (brace,) = [t["id"] for t in tokens(server, "llama3", content="{")["tokens"]]
    called = chat(server, WEATHER, model="llama3", logit_bias={str(brace): 100}).json()["choices"][0]
    assert called["finish_reason"] == "tool_calls" and called["message"]["content"] is None, called
    (call,) = called["message"]["tool_calls"]  # one call: Llama 3.x's templates take no more
    assert call["function"]["name"] in ("get_weather", "add")


def test_tools_with_a_response_format_in_a_models_own_format(server):
    """Under auto with a response_format, the answer is the calls in the model's format or, from its
    first token, the JSON the format asks for (no text before either)."""
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"],
        "additionalProperties": False}}}
    (brace,) = [t["id"] for t in tokens(server, "hermes", content="{")["tokens"]]
    replied = chat(server, WEATHER, response_format=fmt, logit_bias={str(brace): 100}).json()["choices"][0]
    assert replied["finish_reason"] == "stop" and "tool_calls" not in replied["message"], replied
    assert list(json.loads(replied["message"]["content"])) == ["city"]
    # `add` only: its call has no free string, where the tag (pushed up everywhere) is valid text
    called = chat(server, WEATHER, tools=[TOOLS[1]], response_format=fmt, logit_bias=CALL_FIRST,
                  parallel_tool_calls=False).json()["choices"][0]
    assert called["finish_reason"] == "tool_calls" and called["message"]["content"] is None, called
    assert [c["function"]["name"] for c in called["message"]["tool_calls"]] == ["add"]
    r = chat(server, WEATHER, model="gpt-oss", response_format=fmt)
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format", r.text


def test_llama3s_python_tag_opens_its_call_and_is_never_content(server):
    """Llama 3.x models write `<|python_tag|>` before a call in the ipython environment their
    templates set up for tools: the call after it is held by the grammar and read, streamed or not."""
    tag = {"9": 100}  # <|python_tag|>, which the untrained model is made to write first
    called = chat(server, WEATHER, model="llama3-tag", logit_bias=tag).json()["choices"][0]
    assert called["finish_reason"] == "tool_calls" and called["message"]["content"] is None, called
    (call,) = called["message"]["tool_calls"]
    assert call["function"]["name"] in ("get_weather", "add")
    json.loads(call["function"]["arguments"])
    body = {"model": "llama3-tag", "messages": WEATHER, "tools": TOOLS, "temperature": 0, "max_tokens": 80,
            "logit_bias": tag, "stream": True}
    with httpx.stream("POST", server.base + "/v1/chat/completions", json=body, timeout=300) as r:
        choices = [json.loads(line[6:])["choices"][0] for line in r.iter_lines()
                   if line.startswith("data: ") and line != "data: [DONE]"]
    assert not "".join(c["delta"].get("content") or "" for c in choices)
    assert [c["function"] for c in streamed_calls(choices)] == [call["function"]]  # greedy: the same call
    assert choices[-1]["finish_reason"] == "tool_calls"
    # without the push, the same answer as the untagged model's: text that is not a call
    free = chat(server, WEATHER, model="llama3-tag", max_tokens=30).json()["choices"][0]
    plain = chat(server, WEATHER, model="llama3", max_tokens=30).json()["choices"][0]
    assert free["message"]["content"] == plain["message"]["content"] and free["finish_reason"] != "tool_calls"


@pytest.mark.parametrize("model", OTHER_FORMATS)
def test_history_renders_in_each_models_format(server, model):
    text = prompt_text(server, model, messages=HISTORY, tools=TOOLS)
    if model == "functiongemma":  # the same notation, strings between <escape> marks
        assert ("<start_function_call>call:get_weather{city:<escape>Paris<escape>,unit:<escape>celsius<escape>}"
                "<end_function_call>") in text
        assert "<start_function_response>response:tool{value:<escape>18 degrees, sunny<escape>}" in text
    elif model == "gemma4":  # Gemma 4's notation: bare keys, sorted, strings between <|"|> marks
        assert ('<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,unit:<|"|>celsius<|"|>}<tool_call|>'
                '<|tool_response>response:get_weather{value:<|"|>18 degrees, sunny<|"|>}<tool_response|>') in text
    elif model == "qwen3-coder":  # strings as raw text, other values as JSON
        assert ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call><|im_end|>") in text
        assert "<tool_response>\n18 degrees, sunny\n</tool_response>" in text
    elif model == "glm":  # strings as raw text between the key and value tags
        assert ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
                "<arg_key>unit</arg_key>\n<arg_value>celsius</arg_value>\n</tool_call><|im_end|>") in text
        assert "<|im_start|>observation\n<tool_response>\n18 degrees, sunny\n</tool_response>" in text
    elif model == "minicpm5":  # XML elements after the content, results in the user's turn
        assert ('<|im_start|>assistant\n<function name="get_weather"><param name="city">Paris</param>'
                '<param name="unit">celsius</param></function><|im_end|>') in text
        assert "<|im_start|>user\n<tool_response>\n18 degrees, sunny\n</tool_response>" in text
    elif model == "gpt-oss":  # the call in the commentary channel, its result from functions.get_weather
        assert ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris", '
                '"unit": "celsius"}<|call|><|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>'
                '"18 degrees, sunny"<|end|>') in text
    elif model == "command-r":  # numbered calls in its action block
        assert ('<|START_THINKING|><|END_THINKING|><|START_ACTION|>[    {"tool_call_id": "0", "tool_name": "get_weather", '
                '"parameters": {"city": "Paris", "unit": "celsius"}}]<|END_ACTION|>') in text
        assert '<|START_TOOL_RESULT|>[{"tool_call_id": "call_1", "results": {"0": "18 degrees, sunny"}}]' in text
    elif model == "apertus":  # objects keyed by the name between its tags, the results after them
        assert ('<|assistant_start|><|tools_prefix|>[{"get_weather": {"city": "Paris", "unit": "celsius"}}]'
                "<|tools_suffix|>[18 degrees, sunny]<|assistant_start|>") in text
    elif model == "apriel":  # a JSON list between its tags, with the call's id
        assert ('<|begin_assistant|>\n\n<tool_calls>[{"name": "get_weather", "arguments": {"city": "Paris", '
                '"unit": "celsius"}, "id": "call_1"}]</tool_calls>\n<|end|>\n<|begin_tool_result|>\n18 degrees, sunny\n'
                "<|begin_assistant|>\nHere are my reasoning steps:\n") in text
    elif model == "seed-oss":  # qwen3-coder's body in its own tags, values right after their tags
        assert ("<seed:bos>assistant\n<seed:tool_call>\n<function=get_weather>\n<parameter=city>Paris</parameter>\n"
                "<parameter=unit>celsius</parameter>\n</function>\n</seed:tool_call><seed:eos>"
                "<seed:bos>tool\n18 degrees, sunny<seed:eos>") in text
    elif model == "minimax":  # one block of invocations, string values as raw text, results in a tool turn
        assert ('\n<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Paris</parameter>\n'
                '<parameter name="unit">celsius</parameter>\n</invoke>\n</minimax:tool_call>[e~[\n]~b]tool\n'
                "<response>18 degrees, sunny</response>[e~[") in text
    elif model == "kimi-k2":  # each call's id numbered between its tags, a result headed by its call's id
        assert ('<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>'
                'functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris", "unit": "celsius"}'
                "<|tool_call_end|><|tool_calls_section_end|><|im_end|><|im_system|>tool<|im_middle|>"
                "## Return of call_1") in text
    elif model == "deepseek-r1":  # a fenced JSON block after the name, the results as tool outputs
        assert ("<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
                '{"city": "Paris", "unit": "celsius"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>'
                "<｜tool▁outputs▁begin｜>\n<｜tool▁output▁begin｜>18 degrees, sunny<｜tool▁output▁end｜>") in text
    elif model == "gigachat":  # one call after the content, its result as a role of its own
        assert ('assistant<|role_sep|>\n<|function_call|>{"name": "get_weather", "arguments": {"city": "Paris", '
                '"unit": "celsius"}}<|message_sep|>\n\nfunction result<|role_sep|>\n18 degrees, sunny') in text
    elif model == "nemotron":  # a JSON list between its tags
        assert ('<|im_start|>assistant\n<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Paris", '
                '"unit": "celsius"}}]</TOOLCALL><|im_end|>') in text
        assert "<TOOL_RESPONSE>[18 degrees, sunny]</TOOL_RESPONSE>" in text
    elif model == "granite":  # written into the assistant's content, as the model writes it
        assert ('<|im_start|>assistant\n<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", '
                '"unit": "celsius"}}]<|im_end|>\n<|im_start|>tool\n18 degrees, sunny<|im_end|>') in text
    elif model == "lfm2":  # written into the assistant's content, in Python's notation
        assert ('<|im_start|>assistant\n<|tool_call_start|>[get_weather(city="Paris", unit="celsius")]'
                "<|tool_call_end|><|im_end|>\n<|im_start|>tool\n<|tool_response_start|>18 degrees, sunny"
                "<|tool_response_end|><|im_end|>") in text
    elif model == "llama3":
        assert ('<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": '
                '{"city": "Paris", "unit": "celsius"}}<|eot_id|>') in text
        assert "<|start_header_id|>ipython<|end_header_id|>\n\n18 degrees, sunny<|eot_id|>" in text
    else:  # the client's id, made one of Mistral's: the call and its result keep their pair
        cid = mistral_id("call_1")
        if model == "mistral":
            assert ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}, '
                    f'"id": "{cid}"}}]') in text
            assert f'[TOOL_RESULTS]{{"content": "18 degrees, sunny", "call_id": "{cid}"}}[/TOOL_RESULTS]' in text
        else:
            assert f'[TOOL_CALLS]get_weather[CALL_ID]{cid}[ARGS]{{"city": "Paris", "unit": "celsius"}}' in text
            assert f"[TOOL_RESULTS]{cid}[TOOL_CONTENT]18 degrees, sunny[/TOOL_RESULTS]" in text
    r = chat(server, HISTORY, model=model, max_tokens=10)
    assert r.status_code == 200, r.text


def test_a_mistral_call_id_goes_back_into_its_template_unchanged(server):
    out = chat(server, WEATHER, model="mistral", parallel_tool_calls=False,
               tool_choice={"type": "function", "function": {"name": "get_weather"}}).json()["choices"][0]["message"]
    call = out["tool_calls"][0]
    messages = [*WEATHER, out, {"role": "tool", "tool_call_id": call["id"], "content": "18 degrees"}]
    text = prompt_text(server, "mistral", messages=messages, tools=TOOLS)
    assert f'"id": "{call["id"]}"' in text and f'"call_id": "{call["id"]}"' in text


def test_llama3s_template_refuses_two_calls_in_one_turn(server):
    two = [*WEATHER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"call_{k}", "type": "function", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}
        for k in range(2)]}]
    r = chat(server, two, model="llama3")
    assert r.status_code == 400 and "single tool-calls" in r.json()["error"]["message"], r.text


def test_an_ollama_history_without_call_ids_renders_in_mistrals_template(server):
    """Ollama's clients send calls and results without ids; Mistral's template refuses a result
    without one, so each result takes its call's."""
    messages = [*WEATHER,
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
                {"role": "tool", "content": "18 degrees, sunny", "tool_name": "get_weather"}]
    for model in ("mistral", "mistral-args"):
        r = httpx.post(server.base + "/api/chat", timeout=300, json={
            "model": model, "messages": messages, "tools": TOOLS, "stream": False,
            "options": {"temperature": 0, "num_predict": 5}})
        assert r.status_code == 200, r.text


def test_qwen3_coder_values_read_back_as_their_schemas_types(server):
    """Integers are written as text between tags; the call's arguments are JSON integers again,
    and strings stay strings."""
    r = chat(server, [{"role": "user", "content": "Add 2 and 3."}], model="qwen3-coder", tools=TOOLS,
             tool_choice={"type": "function", "function": {"name": "add"}})
    assert r.status_code == 200, r.text
    (call,) = r.json()["choices"][0]["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert {k: type(v) for k, v in args.items()} == {"a": int, "b": int}, args


def test_a_tag_written_while_thinking_is_thought_and_a_call_comes_after_the_block(server):
    """The lazy grammar waits out the think block (Qwen3.5's template opens it): the model pushed
    to write `<tool_call>` writes it three times as thought, the budget closes the block, and the
    tag after it opens the call."""
    r = chat(server, WEATHER, model="qwen3-coder", tools=[TOOLS[1]], logit_bias=CALL_FIRST, parallel_tool_calls=False,
             chat_template_kwargs={"enable_thinking": True}, thinking_budget_tokens=3)  # `add`: no free text
    assert r.status_code == 200, r.text
    out = r.json()["choices"][0]
    assert out["message"]["reasoning_content"].strip() == "<tool_call>" * 3, out
    assert out["finish_reason"] == "tool_calls" and out["message"]["tool_calls"][0]["function"]["name"] == "add", out


def test_gemma4_calls_read_back_from_its_notation(server):
    """Integers come out as JSON integers, and a call the model opens under `auto` (its tag
    pushed up) is held to the notation and read back."""
    r = chat(server, [{"role": "user", "content": "Add 2 and 3."}], model="gemma4", tools=[TOOLS[1]],
             logit_bias={"9": 100}, parallel_tool_calls=False)  # <|tool_call>
    assert r.status_code == 200, r.text
    out = r.json()["choices"][0]
    assert out["finish_reason"] == "tool_calls" and "<|tool_call>" not in (out["message"]["content"] or ""), out
    (call,) = out["message"]["tool_calls"]
    args = json.loads(call["function"]["arguments"])
    assert call["function"]["name"] == "add" and {k: type(v) for k, v in args.items()} == {"a": int, "b": int}


def test_gemma4s_thought_channel_is_its_reasoning(server):
    """Gemma 4 thinks in `<|channel>thought ... <channel|>` (control tokens, hidden in plain text):
    the server writes them out and splits the thought from the answer. A grammar makes the
    untrained model write a channel."""
    thought = 'root ::= <[12]> "thought\\n" [a-z ]{10,40} <[13]> [A-Za-z ]{5,30}'
    body = {"grammar": thought, "chat_template_kwargs": {"enable_thinking": True}, "tools": None}
    split = chat(server, WEATHER, model="gemma4", **body).json()["choices"][0]["message"]
    raw = chat(server, WEATHER, model="gemma4", reasoning_format="none", **body).json()["choices"][0]["message"]
    assert raw["content"].startswith("<|channel>thought\n") and "<channel|>" in raw["content"], raw
    assert split["reasoning_content"] == raw["content"].split("<channel|>")[0][len("<|channel>thought\n"):].strip()
    assert split["content"] == raw["content"].split("<channel|>", 1)[1].lstrip() and split["content"]
    cards = {c["id"]: c for c in httpx.get(server.base + "/v1/models").json()["data"]}
    assert cards["gemma4"]["reasoning"] is True


def test_anthropic_and_responses_clients_round_trip_calls_through_mistrals_ids(server):
    """The Messages API's `toolu_` ids and the Responses API's call ids go back into a Mistral
    template as its 9-character kind, the call and its result paired."""
    weather = {"name": "get_weather", "description": "Current weather in a city",
               "input_schema": TOOLS[0]["function"]["parameters"]}
    body = {"model": "mistral-args", "max_tokens": 80, "temperature": 0, "tools": [weather], "messages": WEATHER}
    r = httpx.post(server.base + "/v1/messages", timeout=300, json={
        **body, "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}})
    assert r.status_code == 200, r.text
    (use,) = r.json()["content"]
    assert use["type"] == "tool_use" and use["name"] == "get_weather" and set(use["input"]) == {"city", "unit"}
    history = [*WEATHER, {"role": "assistant", "content": [use]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use["id"], "content": "18 C"}]}]
    r = httpx.post(server.base + "/v1/messages", timeout=300, json={**body, "max_tokens": 5, "messages": history})
    assert r.status_code == 200, r.text
    r = httpx.post(server.base + "/v1/responses", timeout=300, json={
        "model": "mistral-args", "input": WEATHER[0]["content"], "tools": [{"type": "function", **TOOLS[0]["function"]}],
        "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0, "max_output_tokens": 80})
    assert r.status_code == 200, r.text
    (call,) = [item for item in r.json()["output"] if item["type"] == "function_call"]
    r = httpx.post(server.base + "/v1/responses", timeout=300, json={
        "model": "mistral-args", "previous_response_id": r.json()["id"], "max_output_tokens": 5,
        "tools": [{"type": "function", **TOOLS[0]["function"]}],
        "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "18 C"}]})
    assert r.status_code == 200, r.text


def few_shot_weather(city: str) -> list[dict]:
    """Two weather turns answered by calls, then the question for `city`: SmolLM2 goes on in the
    pattern and writes the call's tag itself."""
    out = []
    for k, (town, degrees) in enumerate((("Rome", 20), ("Oslo", 5))):
        out += [{"role": "user", "content": f"What is the weather in {town}?"},
                {"role": "assistant", "content": None, "tool_calls": [{"id": f"c{k}", "type": "function", "function": {
                    "name": "get_weather", "arguments": json.dumps({"city": town, "unit": "celsius"})}}]},
                {"role": "tool", "tool_call_id": f"c{k}", "content": f"{degrees} degrees"},
                {"role": "assistant", "content": f"It is {degrees} degrees in {town}."}]
    return out + [{"role": "user", "content": f"What is the weather in {city}?"}]


@pytest.mark.parametrize("model", ("minicpm5", "apriel"))
def test_under_auto_a_call_is_held_from_its_tag_written_as_text(server, model):
    """MiniCPM 5's tag is text, and so is Apriel's in a vocabulary without it: the grammar waits
    for the model to write it, then holds the call. The earlier calls say celsius; a schema that
    takes only kelvin gets kelvin once the tag is out."""
    kelvin = json.loads(json.dumps(TOOLS[0]))
    kelvin["function"]["parameters"]["properties"]["unit"] = {"enum": ["kelvin"]}
    out = chat(server, few_shot_weather("Paris"), model=model, tools=[kelvin]).json()["choices"][0]
    content = out["message"]["content"] or ""  # SmolLM2 may write something else first (it is not Apriel)
    assert out["finish_reason"] == "tool_calls" and "<function" not in content and "<tool_calls" not in content, out
    (call,) = out["message"]["tool_calls"]
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "unit": "kelvin"}
    free = chat(server, WEATHER, model=model, max_tokens=30).json()["choices"][0]
    assert free["finish_reason"] == "length" and "<function" not in free["message"]["content"], free
    chunks = []
    with httpx.stream("POST", server.base + "/v1/chat/completions", timeout=300, json={
            "model": model, "messages": few_shot_weather("Paris"), "tools": [kelvin], "temperature": 0,
            "stream": True, "max_tokens": 80}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:])["choices"][0])
    (streamed,) = streamed_calls(chunks)
    assert streamed["function"] == call["function"]
    assert "".join(c["delta"].get("content") or "" for c in chunks) == content


def test_a_reasoning_budget_is_told_to_a_template_that_takes_one(server):
    """Seed-OSS's template takes `thinking_budget`: the request's reasoning budget goes there (0:
    answer without thinking), unless the request's template variables set it themselves."""
    def applied(**body) -> str:
        r = httpx.post(server.base + "/apply-template", timeout=60, json={"model": "seed-oss", "messages": WEATHER, **body})
        assert r.status_code == 200, r.text
        return r.json()["prompt"]

    assert "thinking budget" not in applied()
    assert "Your thinking budget is 0: answer without thinking." in applied(thinking_budget_tokens=0)
    assert "Your thinking budget is 128 tokens." in applied(thinking_budget_tokens=128)
    assert "is 64 tokens" in applied(thinking_budget_tokens=128, chat_template_kwargs={"thinking_budget": 64})
    assert "thinking budget" not in prompt_text(server, "hermes", messages=WEATHER)  # a template without it
