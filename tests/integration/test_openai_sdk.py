"""The official OpenAI SDK against the real server, both real models."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

MODELS = ["smollm2-135m", "gemma3-270m"]
CHAT = [{"role": "user", "content": "Write one sentence about cats."}]


@pytest.fixture(scope="module")
def client(main_server) -> openai.OpenAI:
    return openai.OpenAI(base_url=main_server.base + "/v1", api_key="unused", max_retries=0)


def test_model_listing(client):
    ids = [m.id for m in client.models.list()]
    assert ids == MODELS
    for model in MODELS:  # GET /v1/models/{id}: the list's card
        assert client.models.retrieve(model).model_dump() == next(
            m for m in client.models.list() if m.id == model).model_dump()
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("nope")
    assert e.value.body["param"] == "model" and e.value.body["code"] == "model_not_found"


@pytest.mark.parametrize("model", MODELS)
def test_chat_streamed_equals_non_streamed(client, model):
    full = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=24)
    choice = full.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content.strip()
    assert choice.finish_reason in ("stop", "length")
    assert full.usage.completion_tokens > 0 and full.usage.prompt_tokens > 5
    assert full.usage.total_tokens == full.usage.prompt_tokens + full.usage.completion_tokens

    stream = client.chat.completions.create(
        model=model, messages=CHAT, temperature=0, max_tokens=24, stream=True,
        stream_options={"include_usage": True},
    )
    parts, reasons, usage, roles = [], [], None, []
    for chunk in stream:
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            if c.delta.role:
                roles.append(c.delta.role)
            if c.delta.content:
                parts.append(c.delta.content)
            if c.finish_reason:
                reasons.append(c.finish_reason)
    assert "".join(parts) == choice.message.content
    assert roles == ["assistant"]
    assert reasons == [choice.finish_reason]
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens


@pytest.mark.parametrize("model", MODELS)
def test_completion_streamed_equals_non_streamed(client, model):
    full = client.completions.create(model=model, prompt="The capital of France is", temperature=0, max_tokens=12)
    text = full.choices[0].text
    assert text.strip()
    assert full.choices[0].finish_reason == "length"
    assert full.usage.completion_tokens == 12

    stream = client.completions.create(
        model=model, prompt="The capital of France is", temperature=0, max_tokens=12, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == text


def test_completion_usage_counts_each_prompt_once_streamed_or_not(client):
    """usage.prompt_tokens: each prompt once however many choices it has (n), every prompt of a
    list, the same streamed as whole (it was counted once per choice whole, and as whichever
    sequence ended first streamed)."""
    alone = {p: client.completions.create(model="smollm2-135m", prompt=p, max_tokens=1).usage.prompt_tokens
             for p in ("The capital of France is", "Hello")}
    assert alone["The capital of France is"] > alone["Hello"]
    prompts = list(alone)
    for prompt, n in ((prompts[0], 3), (prompts, 1), (prompts, 2)):
        kw = dict(model="smollm2-135m", prompt=prompt, max_tokens=3, n=n, temperature=0.8, seed=5)
        whole = client.completions.create(**kw).usage
        streamed = [c.usage for c in client.completions.create(**kw, stream=True, stream_options={"include_usage": True})
                    if c.usage]
        expected = alone[prompt] if isinstance(prompt, str) else sum(alone.values())
        assert whole.prompt_tokens == streamed[0].prompt_tokens == expected, (prompt, n, whole, streamed)
        assert whole.completion_tokens == streamed[0].completion_tokens == 3 * n * (1 if isinstance(prompt, str) else 2)


def test_completion_default_max_tokens_is_16(client):
    r = client.completions.create(model="smollm2-135m", prompt="Once upon a time", temperature=0)
    assert r.usage.completion_tokens <= 16
    assert r.choices[0].finish_reason == "length" or r.usage.completion_tokens < 16


def test_stop_string_is_never_emitted(client):
    base = client.completions.create(model="smollm2-135m", prompt="Count: 1, 2, 3, 4,", temperature=0, max_tokens=20)
    text = base.choices[0].text
    assert " 6" in text, text  # the model counts on; stop at a multi-character string inside the output
    stop = text[text.index(" 6") : text.index(" 6") + 3]
    r = client.completions.create(
        model="smollm2-135m", prompt="Count: 1, 2, 3, 4,", temperature=0, max_tokens=20, stop=[stop]
    )
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text[: text.index(stop)]
    streamed = client.completions.create(
        model="smollm2-135m", prompt="Count: 1, 2, 3, 4,", temperature=0, max_tokens=20, stop=[stop], stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == r.choices[0].text


def test_seeded_sampling_is_reproducible_and_n_choices(client):
    kw = dict(model="smollm2-135m", messages=CHAT, temperature=0.9, top_p=0.95, seed=1234, max_tokens=16,
              extra_body={"top_k": 40, "min_p": 0.05})
    a = client.chat.completions.create(**kw)
    b = client.chat.completions.create(**kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    many = client.chat.completions.create(**{**kw, "seed": None}, n=3)
    assert [c.index for c in many.choices] == [0, 1, 2]


def test_logit_bias_bans_a_token(client):
    base = client.completions.create(model="smollm2-135m", prompt="The capital of France is", temperature=0, max_tokens=1)
    assert base.choices[0].text == " Paris"
    import httpx

    # 7042 is " Paris" in SmolLM2's vocabulary
    tok = httpx.post(
        str(client.base_url).rstrip("/") + "/completions",
        json={"model": "smollm2-135m", "prompt": "The capital of France is", "max_tokens": 1, "temperature": 0,
              "logit_bias": {"7042": -100}},
    ).json()
    assert tok["choices"][0]["text"] != " Paris"


def test_utf8_multibyte_characters_survive_streaming(client):
    prompt = "Translate to Japanese: cat = 猫, dog = 犬, bird ="
    full = client.completions.create(model="gemma3-270m", prompt=prompt, temperature=0, max_tokens=24)
    stream = client.completions.create(model="gemma3-270m", prompt=prompt, temperature=0, max_tokens=24, stream=True)
    chunks = [c.choices[0].text for c in stream if c.choices]
    assert "".join(chunks) == full.choices[0].text
    assert all("\ufffd" not in c for c in chunks)
    assert any(ord(ch) > 0x2E80 for ch in full.choices[0].text), full.choices[0].text


@pytest.mark.parametrize("model", MODELS)
def test_chat_logprobs_streamed_and_not(client, model):
    full = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=12,
                                          logprobs=True, top_logprobs=3)
    content = full.choices[0].logprobs.content
    assert "".join(t.token for t in content) == full.choices[0].message.content
    for t in content:
        assert t.logprob <= 0 and len(t.top_logprobs) == 3
        assert [x.logprob for x in t.top_logprobs] == sorted((x.logprob for x in t.top_logprobs), reverse=True)
        assert t.top_logprobs[0].token == t.token and t.top_logprobs[0].logprob == pytest.approx(t.logprob)
        assert bytes(t.bytes).decode("utf-8", "replace") == t.token
    stream = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=12,
                                            logprobs=True, top_logprobs=3, stream=True)
    streamed = [t for c in stream if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.content]
    assert [(t.token, round(t.logprob, 4)) for t in streamed] == [(t.token, round(t.logprob, 4)) for t in content]
    plain = client.chat.completions.create(model=model, messages=CHAT, temperature=0, max_tokens=4)
    assert plain.choices[0].logprobs is None


def test_completion_logprobs_cover_the_text_up_to_a_stop_string(client):
    """The logprobs' tokens join to the text however a stop string falls: a token whose text was
    held back as a stop's possible start and then let out in part kept its logprob (its token one
    past the text) when the stop came; now a token goes with its text once all of it is out."""
    prompt = "1, 2, 3, 4, 5, 6, 7, 8,"
    base = client.completions.create(model="smollm2-135m", prompt=prompt, temperature=0, max_tokens=20)
    assert "11" in base.choices[0].text, base.choices[0].text
    for stop in ("1,", "1, 1", "10", ", 11", "11,", " 1"):
        for stream in (False, True):
            r = client.completions.create(model="smollm2-135m", prompt=prompt, temperature=0, max_tokens=20,
                                          logprobs=1, stop=[stop], stream=stream)
            chunks = list(r) if stream else [r]
            text = "".join(c.choices[0].text for c in chunks if c.choices)
            tokens = [t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
            assert "".join(tokens) == text == base.choices[0].text[:base.choices[0].text.index(stop)], (stop, stream)


def test_completion_logprobs(client):
    r = client.completions.create(model="smollm2-135m", prompt="The capital of France is", temperature=0,
                                  max_tokens=6, logprobs=2)
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == r.choices[0].text
    assert lp.tokens[0] == " Paris" and len(lp.top_logprobs[0]) == 2 and " Paris" in lp.top_logprobs[0]
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)
    assert all(v <= 0 for v in lp.token_logprobs)
    # streamed, each chunk's offsets go on from the text before it (every chunk restarted at 0)
    chunks = [c for c in client.completions.create(model="smollm2-135m", prompt="The capital of France is",
                                                   temperature=0, max_tokens=6, logprobs=2, stream=True)
              if c.choices and c.choices[0].logprobs]
    assert [o for c in chunks for o in c.choices[0].logprobs.text_offset] == lp.text_offset


def test_completion_echo_scores_the_prompt(client):
    r = client.completions.create(model="gemma3-270m", prompt="The capital of France is", temperature=0,
                                  max_tokens=0, logprobs=1, echo=True)
    choice = r.choices[0]
    assert choice.text == "The capital of France is" and choice.finish_reason == "length"
    lp = choice.logprobs
    assert len(lp.tokens) == r.usage.prompt_tokens and r.usage.completion_tokens == 0
    assert lp.token_logprobs[0] is None and all(v < 0 for v in lp.token_logprobs[1:])
    assert lp.top_logprobs[0] is None and all(len(t) == 1 for t in lp.top_logprobs[1:])


@pytest.mark.parametrize("model", MODELS)
def test_structured_output_parses_into_a_pydantic_model(client, model):
    """The SDK's parse() sends its strict JSON Schema of the model and parses the answer with it."""
    from typing import Literal

    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int
        city: str
        mood: Literal["happy", "sad"]

    done = client.chat.completions.parse(
        model=model, temperature=0, max_tokens=80, response_format=Person,
        messages=[{"role": "user", "content": "Ann is 31, lives in Oslo and is happy. Describe her as JSON."}])
    person = done.choices[0].message.parsed
    assert isinstance(person, Person) and person.mood in ("happy", "sad"), done


def test_tool_calls_through_the_sdk(client):
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "Current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": False}}}]
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    done = client.chat.completions.create(model="gemma3-270m", messages=messages, tools=tools, tool_choice=named,
                                          temperature=0, max_tokens=60)
    (call,) = done.choices[0].message.tool_calls
    assert done.choices[0].finish_reason == "tool_calls" and call.function.name == "get_weather"
    import json

    assert set(json.loads(call.function.arguments)) == {"city"}
    streamed = [c for chunk in client.chat.completions.create(
        model="gemma3-270m", messages=messages, tools=tools, tool_choice=named, temperature=0, max_tokens=60,
        stream=True) for c in chunk.choices]
    deltas = [d for c in streamed if c.delta.tool_calls for d in c.delta.tool_calls]
    assert len(deltas) > 1 and deltas[0].function.name == "get_weather" and deltas[0].id  # in pieces, as written
    assert "".join(d.function.arguments for d in deltas) == call.function.arguments
    assert streamed[-1].finish_reason == "tool_calls"
    # the call and its result go back as history
    messages += [done.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "4 degrees and snow"}]
    after = client.chat.completions.create(model="gemma3-270m", messages=messages, tools=tools, tool_choice="none",
                                           temperature=0, max_tokens=30)
    assert after.choices[0].message.content


def test_legacy_functions_through_the_sdk(client):
    """The SDK's deprecated functions= and function_call=: the call comes back as
    message.function_call, and goes back as history with a function message."""
    import json

    functions = [{"name": "get_weather", "description": "Current weather in a city",
                  "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                                 "additionalProperties": False}}]
    messages = [{"role": "user", "content": "What is the weather in Oslo?"}]
    done = client.chat.completions.create(model="gemma3-270m", messages=messages, functions=functions,
                                          function_call={"name": "get_weather"}, temperature=0, max_tokens=60)
    message = done.choices[0].message
    assert done.choices[0].finish_reason == "function_call" and message.tool_calls is None
    assert message.function_call.name == "get_weather" and set(json.loads(message.function_call.arguments)) == {"city"}
    messages += [message.model_dump(exclude_none=True), {"role": "function", "name": "get_weather", "content": "4 C"}]
    after = client.chat.completions.create(model="gemma3-270m", messages=messages, functions=functions,
                                           function_call="none", temperature=0, max_tokens=30)
    assert after.choices[0].message.content and after.choices[0].finish_reason in ("stop", "length")


@pytest.mark.parametrize("model", MODELS)
def test_parse_with_tools_and_an_output_model(client, model):
    """parse() with a pydantic output model and strict function tools (what an agent with an output
    type sends): the answer parses as the model, or as a call whose arguments parse as the tool's."""
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    class GetWeather(BaseModel):
        city: str

    done = client.chat.completions.parse(
        model=model, temperature=0, max_tokens=80, response_format=Person,
        tools=[openai.pydantic_function_tool(GetWeather)],
        messages=[{"role": "user", "content": "Ann is 31. Describe her as JSON."}])
    message = done.choices[0].message
    if message.tool_calls:
        assert done.choices[0].finish_reason == "tool_calls"
        assert isinstance(message.tool_calls[0].function.parsed_arguments, GetWeather), done
    else:
        assert isinstance(message.parsed, Person), done


def test_an_assistant_refusal_part_is_replayed_as_its_text(client, main_server):
    """OpenAI's assistant message may hold a refusal part (a conversation replayed with one was a
    400): it is read as its text."""
    messages = [{"role": "user", "content": "Tell me a secret."},
                {"role": "assistant", "content": [{"type": "refusal", "refusal": "I cannot share secrets."}]},
                {"role": "user", "content": "A joke then."}]
    shown = httpx.post(main_server.base + "/apply-template", timeout=60,
                       json={"model": "smollm2-135m", "messages": messages}).json()["prompt"]
    assert "assistant\nI cannot share secrets.<|im_end|>" in shown
    r = client.chat.completions.create(model="smollm2-135m", messages=messages, max_tokens=4)
    assert r.choices[0].message.content


def test_a_nullable_field_sent_as_null_takes_its_default(main_server):
    # clients that write None as null (LiteLLM, Jackson- or pydantic-based ones) got a 400 for
    # the fields OpenAI documents as nullable
    nulls = {"temperature": None, "top_p": None, "n": None, "stream": None, "presence_penalty": None,
             "frequency_penalty": None, "store": None, "parallel_tool_calls": None}
    ask = {"model": "smollm2-135m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "seed": 1}
    with_nulls = httpx.post(main_server.base + "/v1/chat/completions", json={**ask, **nulls}, timeout=120)
    without = httpx.post(main_server.base + "/v1/chat/completions", json=ask, timeout=120)
    assert with_nulls.status_code == 200, with_nulls.text
    assert with_nulls.json()["choices"][0]["message"] == without.json()["choices"][0]["message"]
    r = httpx.post(main_server.base + "/v1/completions", timeout=120, json={
        "model": "smollm2-135m", "prompt": "Hi", "max_tokens": 2, "echo": None, "temperature": None, "n": None})
    assert r.status_code == 200, r.text
    r = httpx.post(main_server.base + "/v1/chat/completions", json={**ask, "model": None}, timeout=120)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"  # a required field is still required


def test_every_seed_repeats_its_answer(main_server):
    # 2^32-1 (and -1, which wrapped to it) is llama.cpp's "draw a random seed": those answers
    # changed at every request, and so did a later choice of n that wrapped there
    def ask(seed: int, n: int = 1) -> list[str]:
        r = httpx.post(main_server.base + "/v1/chat/completions", timeout=120, json={
            "model": "smollm2-135m", "messages": [{"role": "user", "content": "Write a sentence about dogs."}],
            "max_tokens": 12, "temperature": 1.0, "seed": seed, "n": n})
        assert r.status_code == 200, r.text
        return [c["message"]["content"] for c in r.json()["choices"]]

    for seed, n in ((2**32 - 1, 1), (-1, 1), (-2, 2)):
        assert ask(seed, n) == ask(seed, n), seed


def test_streamed_usage_with_n_counts_the_prompt_as_the_whole_answer_does(main_server):
    # it took the cached count of whichever choice ended first (0 where the whole answer said 96)
    ask = {"model": "smollm2-135m", "max_tokens": 8, "temperature": 1.0, "seed": 3, "n": 3,
           "messages": [{"role": "user", "content": "Here is a list: " + ", ".join(f"item {i}" for i in range(60))}]}
    httpx.post(main_server.base + "/v1/chat/completions", json={**ask, "n": 1}, timeout=120)  # cached for both
    whole = httpx.post(main_server.base + "/v1/chat/completions", json=ask, timeout=120).json()["usage"]
    with httpx.stream("POST", main_server.base + "/v1/chat/completions", timeout=120,
                      json={**ask, "stream": True, "stream_options": {"include_usage": True}}) as r:
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    streamed = chunks[-1]["usage"]
    assert streamed["prompt_tokens"] == whole["prompt_tokens"]
    assert streamed["prompt_tokens_details"]["cached_tokens"] == whole["prompt_tokens_details"]["cached_tokens"] > 0
