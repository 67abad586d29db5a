"""api/native_tools.py's pure parts: the Hermes format's grammar, answers read back whole and as
they stream."""

from __future__ import annotations

import json

import msgspec
import pytest

from appliance.api import native_tools, tools
from appliance.api.native_tools import NativeFormat
from appliance.api.schemas import ChatRequest
from appliance.engine import grammar

WEATHER = {"type": "function", "function": {"name": "w", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "w", "arguments": {"city": "Oslo"}}\n</tool_call>'


def request(**kw) -> ChatRequest:
    return msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}, ChatRequest)


def test_the_grammar_compiles_and_is_lazy_only_under_auto():
    native = NativeFormat("hermes", 7)
    auto = tools.plan(request(tools=[WEATHER]), native)
    assert auto.triggers == (7,) and auto.template_tools == [WEATHER] and auto.instructions == ""
    assert auto.grammar.startswith('root ::= tagged-call ("\\n" tagged-call)*\n')
    grammar.check(None, auto.grammar)
    one = tools.plan(request(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False), native)
    assert one.triggers == () and one.grammar.startswith("root ::= tagged-call\n")
    grammar.check(None, one.grammar)


def test_a_bad_parameter_schema_is_named_under_its_tool():
    bad = {"type": "function", "function": {"name": "x", "parameters": {"type": "object", "properties": {
        "n": {"type": "number", "multipleOf": 3}}}}}
    with pytest.raises(Exception) as e:
        tools.plan(request(tools=[WEATHER, bad]), NativeFormat("hermes", 7))
    assert e.value.param == "tools[1].function.parameters.properties.n.multipleOf"


def test_answers_are_read_into_content_and_calls():
    content, calls, reason = native_tools.read_answer("Let me look.\n" + CALL + "\n" + CALL, "stop")
    assert content == "Let me look." and reason == "tool_calls" and len(calls) == 2
    assert calls[0].function.name == "w" and json.loads(calls[0].function.arguments) == {"city": "Oslo"}
    assert native_tools.read_answer(CALL, "stop")[0] is None
    assert native_tools.read_answer("plain", "stop") == ("plain", None, "stop")
    assert native_tools.read_answer(CALL[:30], "length") == (CALL[:30], None, "length")  # cut short: as it is
    broken = '<tool_call>\n{"name": "w"}\n</tool_call>'  # no arguments: not a call
    assert native_tools.read_answer(broken, "stop") == (broken, None, "stop")


@pytest.mark.parametrize("cut", [1, 3, 12, 14])
def test_a_streamed_answer_gives_out_its_text_and_never_the_tag(cut):
    text = "Sure <tool>.\n" + CALL
    reader = native_tools.AnswerReader()
    out = "".join(reader.push(text[i:i + cut]) for i in range(0, len(text), cut))
    content, calls, reason = reader.finish("stop")
    assert out + (content or "") == "Sure <tool>."
    assert reason == "tool_calls" and calls[0].function.name == "w"
    reader = native_tools.AnswerReader()
    out = "".join(reader.push(p) for p in ("a <tool_c", "at> b\n"))
    assert out + (reader.finish("stop")[0] or "") == "a <tool_cat> b\n"  # not the tag after all
