"""api/tools.py's pure parts: OpenAI's tool turns as plain turns, and answers read back."""

from __future__ import annotations

import json

import msgspec
import pytest

from appliance.api import tools
from appliance.api.schemas import ChatMessage, ChatRequest


def request(**kw) -> ChatRequest:
    return msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}, ChatRequest)


def test_tool_turns_become_user_and_assistant_turns_and_the_instructions_join_the_system_message():
    raw = msgspec.convert([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "w", "arguments": '{"city": "Oslo"}'}},
            {"id": "c2", "type": "function", "function": {"name": "t", "arguments": "not json"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "3 C"},
        {"role": "tool", "tool_call_id": "c2", "content": "12:00"},
        {"role": "user", "content": "And tomorrow?"},
        {"role": "assistant", "content": "Cold."},
    ], list[ChatMessage])
    plain = [{"role": m.role, "content": m.content or ""} for m in raw]
    plan = tools.plan(request(tools=[{"type": "function", "function": {"name": "w"}}]))
    out = tools.conversation(plain, raw, plan)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant"]
    assert out[0]["content"].startswith("Be brief.\n\n") and '"name": "w"' in out[0]["content"]
    assert json.loads(out[2]["content"]) == {"tool_calls": [{"name": "w", "arguments": {"city": "Oslo"}},
                                                            {"name": "t", "arguments": "not json"}]}
    assert out[3]["content"] == "Result of w: 3 C\nResult of t: 12:00\n\nAnd tomorrow?"
    assert json.loads(out[4]["content"]) == {"response": "Cold."}
    without = tools.conversation(plain, raw, None)  # tool_choice none: the same turns, no instructions
    assert without[0]["content"] == "Be brief." and without[4]["content"] == "Cold."


def test_answers_are_read_back_whole_or_cut():
    content, calls, reason = tools.read_answer('{"tool_calls": [{"name": "w", "arguments": {"city": "Oslo"}}]}', "stop")
    assert content is None and reason == "tool_calls" and calls[0].function.name == "w"
    assert json.loads(calls[0].function.arguments) == {"city": "Oslo"} and calls[0].id.startswith("call_")
    assert tools.read_answer('{"response": "It is \\"cold\\"."}', "stop") == ('It is "cold".', None, "stop")
    assert tools.read_answer('{\n "response": "It is cold and wi', "length") == ("It is cold and wi", None, "length")
    assert tools.read_answer('{"tool_calls": [{"name": "w", "argu', "length") == (
        '{"tool_calls": [{"name": "w", "argu', None, "length")
    # calls whose closing brace was the max_tokens-th token are whole (they came back as content)
    content, calls, reason = tools.read_answer('{"tool_calls": [{"name": "w", "arguments": {"city": "Oslo"}}]}', "length")
    assert content is None and reason == "tool_calls" and calls[0].function.name == "w"


@pytest.mark.parametrize("cut", ['{"tool_calls": [{"name": "get_wea', '{"tool_', '{"'])
def test_calls_cut_before_a_name_is_whole_are_no_text_where_calls_stream(cut):
    # a reader whose API streams calls (Ollama, Anthropic, Responses) ends such an answer with no
    # call and no text, as its stream does; it was the envelope's JSON as the answer's text
    reader = tools.AnswerReader(stream_calls=True)
    assert reader.push(cut) == ""
    assert reader.finish("length") == (None, None, "length")
    whole = tools.AnswerReader()  # OpenAI chat asked whole: the text as it is
    whole.push(cut)
    assert whole.finish("length") == (cut, None, "length")


def test_a_streamed_direct_answer_goes_out_decoded_as_it_comes():
    text = '{"response": "caf\\u00e9 \\ud83d\\ude00 \\"ok\\"\\n"}'
    reader, out = tools.AnswerReader(), []
    for i in range(0, len(text), 3):  # pieces cut anywhere, escapes included
        out.append(reader.push(text[i : i + 3]))
    rest, calls, reason = reader.finish("stop")
    assert "".join(out) + rest == 'café 😀 "ok"\n' and calls is None and reason == "stop"
    long = r'line \"one\"\n\u00e9\ud83d\ude00 ' * 2000  # JSON escapes: a long answer is decoded once, from where it was left
    text = '{"response": "' + long + '"}'
    reader = tools.AnswerReader()
    out = [reader.push(text[i:i + 5]) for i in range(0, len(text), 5)]
    rest, _, _ = reader.finish("stop")
    assert "".join(out) + (rest or "") == json.loads('"' + long + '"')
    reader = tools.AnswerReader()
    assert reader.push('{"tool_calls": [{"name": "w", "arguments": {}}]}') == ""
    rest, calls, reason = reader.finish("stop")
    assert rest is None and reason == "tool_calls" and calls[0].function.arguments == "{}"


def test_a_function_may_be_called_auto_and_a_named_choice_allows_only_it():
    tools_ = [{"type": "function", "function": {"name": "auto"}}, {"type": "function", "function": {"name": "b"}}]
    named = tools.plan(request(tools=tools_, tool_choice={"type": "function", "function": {"name": "auto"}}))
    b = '\\"b\\"'  # the GBNF literal of the JSON string "b"
    assert named.mode == "named" and b not in named.grammar and "Call the function auto." in named.instructions
    auto = tools.plan(request(tools=tools_))
    assert auto.mode == "auto" and b in auto.grammar
    assert tools.plan(request(tools=tools_, tool_choice="none")) is None


def test_a_parameters_schema_the_grammar_cannot_hold_is_named_by_its_path_in_every_mode():
    from appliance.api.errors import ApiError
    good = {"type": "object", "properties": {"n": {"type": "integer"}}}
    bad = {"type": "object", "properties": {"x": {"type": "number", "multipleOf": 2}}, "$defs": {}}
    unresolved = {"$ref": "#/$defs/missing"}
    fns = lambda *ps: [{"type": "function", "function": {"name": f"f{i}", "parameters": p}} for i, p in enumerate(ps)]
    cases = [
        ({"tools": fns(good, bad)}, "tools[1].function.parameters.properties.x.multipleOf"),
        ({"tools": fns(bad)}, "tools[0].function.parameters.properties.x.multipleOf"),
        ({"tools": fns(good, bad), "tool_choice": "required"}, "tools[1].function.parameters.properties.x.multipleOf"),
        ({"tools": fns(good, good, unresolved), "parallel_tool_calls": False}, "tools[2].function.parameters.$ref"),
        # a tool the named choice leaves out is checked all the same
        ({"tools": fns(good, bad), "tool_choice": {"type": "function", "function": {"name": "f0"}}},
         "tools[1].function.parameters.properties.x.multipleOf"),
        ({"tools": fns(bad, good), "tool_choice": {"type": "function", "function": {"name": "f0"}}},
         "tools[0].function.parameters.properties.x.multipleOf"),
        ({"tools": fns(False)}, "tools[0].function.parameters"),
        # a call's arguments are an object: a string schema was taken, and no call read back
        ({"tools": fns(good, {"type": "string"})}, "tools[1].function.parameters"),
        ({"tools": fns({"type": ["array", "null"]})}, "tools[0].function.parameters"),
    ]
    for body, param in cases:
        try:
            tools.plan(request(**body))
        except ApiError as e:
            assert e.param == param, (body, e.param)
            assert param in e.message
        else:
            raise AssertionError(f"{body} was accepted")


CITY = '{"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}'


def test_a_response_format_with_tools_makes_the_direct_answer_that_json():
    from appliance.engine import grammar
    from appliance.engine.schema_grammar import schema_to_gbnf

    reply = schema_to_gbnf(json.loads(CITY))
    tools_ = [{"type": "function", "function": {"name": "w", "parameters": json.loads(CITY)}}]
    plan = tools.plan(request(tools=tools_), reply=reply)
    assert plan.reply and plan.mode == "auto"
    assert plan.grammar.startswith("root ::= calls-root | reply-root\n")
    assert "reply-root ::= " in plan.grammar and '"\\"response\\""' not in plan.grammar
    assert "reply with your answer in JSON" in plan.instructions and '"response"' not in plan.instructions
    grammar.check(None, plan.grammar)
    # the two grammars' rules never meet: each side keeps its own
    names = [line.split(" ::= ")[0] for line in plan.grammar.splitlines() if " ::= " in line]
    assert len(names) == len(set(names))
    required = tools.plan(request(tools=tools_, tool_choice="required"), reply=reply)
    assert not required.reply and "reply-root" not in required.grammar  # a call; the format is for later
    assert not tools.plan(request(tools=tools_)).reply


def test_a_request_grammar_with_tools_is_the_direct_answer_under_auto():
    """`grammar` with tools: the answer is the calls or text that follows the request's grammar,
    whose rules (any names, comments, literals that spell rule names) stay apart from the calls'."""
    from appliance.engine import grammar

    own = '# a "reply\nroot ::= verdict ", " calls-root\nverdict ::= "yes" | "no"\ncalls-root ::= [a-z]{1,9}\n'
    tools_ = [{"type": "function", "function": {"name": "w", "parameters": json.loads(CITY)}}]
    plan = tools.plan(request(tools=tools_, grammar=own), reply=own)
    assert plan.reply and plan.grammar.startswith("root ::= calls-root | reply-root\n")
    assert "reply with your answer instead" in plan.instructions and "JSON instead" not in plan.instructions
    grammar.check(None, plan.grammar)
    names = [line.split(" ::= ")[0] for line in plan.grammar.splitlines() if " ::= " in line]
    assert len(names) == len(set(names)) and "reply-calls-root" in names
    content, calls, reason = plan.read("no, later", "stop")
    assert (content, calls, reason) == ("no, later", None, "stop")
    content, calls, reason = plan.read('{"tool_calls": [{"name": "w", "arguments": {"city": "Oslo"}}]}', "stop")
    assert content is None and reason == "tool_calls" and calls[0].function.name == "w"
    assert not tools.plan(request(tools=tools_, grammar=own, tool_choice="required"), reply=own).reply


@pytest.mark.parametrize("cut", [1, 4, 100])
def test_a_streamed_reply_goes_out_as_written_and_calls_are_told_apart_by_their_key(cut):
    text = '{ "city" : "Oslo \\"x\\"" }'
    reader = tools.AnswerReader(reply=True)
    out = "".join(reader.push(text[i:i + cut]) for i in range(0, len(text), cut))
    rest, calls, reason = reader.finish("stop")
    assert out + (rest or "") == text and calls is None and reason == "stop"
    text = '{\n "tool_calls": [{"name": "w", "arguments": {"city": "Oslo"}}]}'
    reader = tools.AnswerReader(reply=True)
    assert "".join(reader.push(text[i:i + cut]) for i in range(0, len(text), cut)) == ""
    rest, calls, reason = reader.finish("stop")
    assert rest is None and reason == "tool_calls" and calls[0].function.name == "w"
    text = '{"tool": 1}'  # begins as the calls' key would, then is not it
    reader = tools.AnswerReader(reply=True)
    out = "".join(reader.push(text[i:i + cut]) for i in range(0, len(text), cut))
    assert out + (reader.finish("stop")[0] or "") == text
    # a reply whose key is "response" is still the JSON as it is, not that key's string
    assert tools.read_answer('{"response": "x"}', "stop", reply=True) == ('{"response": "x"}', None, "stop")
