"""MiniCPM 5's tool calls (`<function name="f"><param name="k">value</param></function>`) and
Seed-OSS's (Qwen3-Coder's body in `<seed:tool_call>` tags, values not framed by newlines): the
grammars walked by llama.cpp's grammar engine over SmolLM2's vocabulary, as the runner walks
them, and the answers read back, a string's value as raw text or out of its CDATA block."""

from __future__ import annotations

import json

import msgspec
import pytest

from appliance.api import native_answers, native_tools, tools
from appliance.api.native_tools import NativeFormat
from appliance.api.errors import ApiError
from appliance.api.schemas import ChatRequest
from grammar_walk import accepts

MINICPM5 = NativeFormat("minicpm5", trigger_text='<function name="')
WRITE = {"type": "function", "function": {"name": "write", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "lines": {"type": "integer"}, "force": {"type": "boolean"}}, "required": ["path"]}}}
FREE = {"type": "function", "function": {"name": "free"}}


def request(**kw) -> ChatRequest:
    return msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}, ChatRequest)


@pytest.fixture(scope="module")
def vocab(smollm2_vocab):
    return smollm2_vocab


def test_auto_waits_for_the_tag_written_as_text_and_required_starts_with_it():
    auto = tools.plan(request(tools=[WRITE]), MINICPM5)
    assert auto.triggers == ('<function name="',) and auto.shown_tokens == ()
    assert tools.plan(request(tools=[WRITE], tool_choice="required"), MINICPM5).triggers == ()


@pytest.mark.parametrize(("text", "ok"), [
    ('<function name="write"><param name="path">a.py</param></function>', True),
    ('<function name="write"><param name="path">a.py</param><param name="lines">3</param>'
     '<param name="force">true</param></function>', True),
    ('<function name="write"><param name="path"><![CDATA[a </param> & b\nc]]></param></function>', True),
    ('<function name="write"><param name="path">a.py</param></function>\n'
     '<function name="free"><param name="anything">x</param></function>', True),
    ('<function name="write"><param name="lines">3</param></function>', False),  # path is required
    ('<function name="write"><param name="path">a.py</param><param name="lines">three</param></function>', False),
    ('<function name="write"><param name="path"><![CDATA[a]]>b]]></param></function>', False),
    ('<function name="read"><param name="path">a.py</param></function>', False),
])
def test_the_grammar_holds_calls_to_the_schemas(vocab, text, ok):
    plan = tools.plan(request(tools=[WRITE, FREE], tool_choice="required"), MINICPM5)
    assert accepts(vocab, plan.grammar, text) is ok


def test_under_auto_text_comes_first_and_the_call_is_held_from_its_tag(vocab):
    plan = tools.plan(request(tools=[WRITE]), MINICPM5)
    call = '<function name="write"><param name="path">a.py</param></function>'
    assert accepts(vocab, plan.grammar, "No call needed: the answer is 4.", plan.triggers)
    assert accepts(vocab, plan.grammar, "Writing it.\n" + call, plan.triggers)
    assert not accepts(vocab, plan.grammar, "Writing it.\n" + call.replace("a.py</param>", "a.py</parm>"), plan.triggers)


def test_values_read_back_by_their_schemas_and_out_of_cdata():
    template_tools = native_tools.template_tools(request(tools=[WRITE]))
    text = ('Sure.\n<function name="write"><param name="path"><![CDATA[x<y>\n]]></param><param name="lines">3</param>'
            '<param name="force">True</param></function>')
    content, calls, reason = native_answers.read_answer(MINICPM5, text, "stop", template_tools)
    assert content == "Sure." and reason == "tool_calls"
    assert json.loads(calls[0].function.arguments) == {"path": "x<y>\n", "lines": 3, "force": True}
    cut = native_answers.read_answer(MINICPM5, text[:-5], "length", template_tools)
    assert cut == (text[:-5], None, "length")


def test_a_streamed_cdata_value_goes_out_as_it_comes_without_its_markers():
    template_tools = native_tools.template_tools(request(tools=[WRITE]))
    text = '<function name="write"><param name="path"><![CDATA[line one\nline </param> two]]></param></function>'
    reader = native_answers.AnswerReader(MINICPM5, template_tools, stream_calls=True)
    pieces = []
    for i in range(0, len(text), 2):
        assert reader.push(text[i:i + 2]) == ""
        pieces += reader.take_calls()
    _, calls, _ = reader.finish("stop")
    pieces += reader.take_calls()
    args = "".join(p.arguments for p in pieces)
    assert args == calls[0].function.arguments == json.dumps({"path": "line one\nline </param> two"})
    assert len(pieces) > 10 and "CDATA" not in args


SEED_OSS = NativeFormat("seed-oss", trigger_text="<seed:tool_call>")


@pytest.mark.parametrize(("text", "ok"), [
    ("<seed:tool_call>\n<function=write>\n<parameter=path>a.py</parameter>\n</function>\n</seed:tool_call>", True),
    ("<seed:tool_call>\n<function=write>\n<parameter=path>a\nb.py</parameter>\n<parameter=lines>3</parameter>\n"
     "</function>\n</seed:tool_call>\n<seed:tool_call>\n<function=free>\n<parameter=x>1</parameter>\n</function>\n"
     "</seed:tool_call>", True),
    ("<seed:tool_call>\n<function=write>\n<parameter=lines>3</parameter>\n</function>\n</seed:tool_call>", False),
    ("<seed:tool_call>\n<function=write>\n<parameter=path>\na.py\n</parameter>\n</function>\n</seed:tool_call>",
     True),  # qwen3-coder's framing newlines are the value's own here
])
def test_seed_oss_grammar_holds_its_calls(vocab, text, ok):
    plan = tools.plan(request(tools=[WRITE, FREE], tool_choice="required"), SEED_OSS)
    assert accepts(vocab, plan.grammar, text) is ok


def test_seed_oss_values_are_read_without_framing_newlines():
    template_tools = native_tools.template_tools(request(tools=[WRITE]))
    text = ("<seed:tool_call>\n<function=write>\n<parameter=path>\na.py</parameter>\n<parameter=force>False</parameter>\n"
            "</function>\n</seed:tool_call>")
    _, calls, reason = native_answers.read_answer(SEED_OSS, text, "stop", template_tools)
    assert reason == "tool_calls" and json.loads(calls[0].function.arguments) == {"path": "\na.py", "force": False}


def test_seed_oss_thinks_in_its_own_tags():
    from appliance.api.chat_answer import AnswerShape
    from appliance.engine import reasoning

    source = "{%- set think_begin_token = '<seed:think>' -%} ... '</seed:think>'"
    assert reasoning.tags_of(source) is reasoning.SEED
    plan = tools.plan(request(tools=[WRITE]), SEED_OSS)
    text = ("<seed:think>A file.</seed:think>\n<seed:tool_call>\n<function=write>\n<parameter=path>a</parameter>\n"
            "</function>\n</seed:tool_call>")
    parts = AnswerShape(plan, reasoning.SEED).whole(text, "stop")
    assert parts.reasoning == "A file." and parts.content is None and parts.tool_calls[0].function.name == "write"


DEEPSEEK = NativeFormat("deepseek-r1", trigger_text="<｜tool▁calls▁begin｜>")
CALLS = "<｜tool▁calls▁begin｜>{}<｜tool▁calls▁end｜>"
CALL = "<｜tool▁call▁begin｜>function<｜tool▁sep｜>{}\n```json\n{}\n```<｜tool▁call▁end｜>"


@pytest.mark.parametrize(("text", "ok"), [
    (CALLS.format(CALL.format("write", '{"path": "a.py"}')), True),
    (CALLS.format(CALL.format("write", '{"path": "a.py", "lines": 3}') + "\n" + CALL.format("free", '{"x": [1]}')), True),
    (CALLS.format(CALL.format("write", '{"lines": 3}')), False),  # path is required
    (CALLS.format(CALL.format("read", '{"path": "a.py"}')), False),
    (CALLS.format(CALL.format("write", '{"path": "a.py"}').replace("```json", "```")), False),
])
def test_deepseeks_grammar_fences_each_calls_arguments(vocab, text, ok):
    plan = tools.plan(request(tools=[WRITE, FREE], tool_choice="required"), DEEPSEEK)
    assert accepts(vocab, plan.grammar, text) is ok


def test_deepseek_under_auto_waits_for_its_tag_as_text(vocab):
    plan = tools.plan(request(tools=[WRITE]), DEEPSEEK)
    assert plan.triggers == ("<｜tool▁calls▁begin｜>",)
    call = CALLS.format(CALL.format("write", '{"path": "a.py"}'))
    assert accepts(vocab, plan.grammar, "<think>\nA file.\n</think>\n\n" + call, plan.triggers)
    content, calls, _ = native_answers.read_answer(DEEPSEEK, "Writing." + call, "stop")
    assert content == "Writing." and json.loads(calls[0].function.arguments) == {"path": "a.py"}


def test_a_raw_text_string_is_held_to_its_length_bounds():
    from appliance.api.native_grammars import xml_grammar
    from appliance.api.native_tools import NativeFormat

    fmt = NativeFormat("qwen3-coder", 1)
    schema = {"type": "object", "properties": {"city": {"type": "string", "minLength": 2, "maxLength": 40},
                                               "note": {"type": "string"}},
              "required": ["city", "note"]}
    grammar = xml_grammar(fmt, [("get_weather", schema)], parallel=False)
    assert "xml-char{2,40}" in grammar and "xml-text ::= xml-char*" in grammar


BOOK = {"type": "function", "function": {"name": "book", "parameters": {"type": "object", "properties": {
    "day": {"type": "string", "format": "date"}, "code": {"type": "string", "pattern": "^[A-Z]{3}-\\d{2}$"},
    "note": {"type": "string", "pattern": "ok"}}, "required": ["day", "code", "note"]}}}


def book(day: str, code: str, note: str) -> str:
    return (f'<function name="book"><param name="day">{day}</param><param name="code">{code}</param>'
            f'<param name="note">{note}</param></function>')


@pytest.mark.parametrize(("text", "ok"), [
    (book("2026-12-06", "ABC-12", "all ok here"), True),
    (book("2026-12-06", "ABC-12", "ok"), True),
    (book("tomorrow", "ABC-12", "ok"), False),  # format: date
    (book("2026-13-06", "ABC-12", "ok"), False),
    (book("2026-12-06", "abc-12", "ok"), False),  # the pattern, anchored at both ends
    (book("2026-12-06", "ABC-123", "ok"), False),
    (book("2026-12-06", "ABC-12", "fine"), False),  # unanchored: "ok" somewhere
])
def test_a_raw_text_string_is_held_to_its_pattern_and_format(vocab, text, ok):
    plan = tools.plan(request(tools=[BOOK], tool_choice="required"), MINICPM5)
    assert accepts(vocab, plan.grammar, text) is ok


@pytest.mark.parametrize(("prop", "param"), [
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, "maxLength"),
    ({"type": "string", "format": "date", "minLength": 3}, "minLength"),
    ({"type": "string", "format": "uuid", "pattern": "^a"}, "format"),
    ({"type": "string", "pattern": "(?=a)a"}, "pattern"),
])
def test_what_a_raw_text_string_cannot_be_held_to_is_refused_by_its_path(prop, param):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"x": prop}}}}
    for fmt in (MINICPM5, NativeFormat("qwen3-coder", 1)):
        with pytest.raises(ApiError) as err:
            tools.plan(request(tools=[tool], tool_choice="required"), fmt)
        assert err.value.param == f"tools[0].function.parameters.properties.x.{param}", err.value.param


def test_pattern_and_format_grammars_compile_for_every_xml_format(vocab):
    from appliance.engine.grammar import Constraint

    for name in ("qwen3-coder", "glm", "seed-oss"):
        grammar = tools.plan(request(tools=[BOOK], tool_choice="required"), NativeFormat(name, 1)).grammar
        assert "[A-Z]" in grammar and "[0-9]{4}" in grammar, grammar
        Constraint(vocab, grammar, ()).close()  # llama.cpp compiles it


MINIMAX = NativeFormat("minimax", trigger_text="<minimax:tool_call>")
MINIMAX_CALL = '<invoke name="write">\n<parameter name="path">{}</parameter>\n</invoke>\n'


@pytest.mark.parametrize(("text", "ok"), [
    ("<minimax:tool_call>\n" + MINIMAX_CALL.format("a.py") + "</minimax:tool_call>", True),
    ("<minimax:tool_call>\n" + MINIMAX_CALL.format("a\nb.py")
     + '<invoke name="free">\n<parameter name="x">1</parameter>\n</invoke>\n</minimax:tool_call>', True),  # one block
    ("<minimax:tool_call>\n" + MINIMAX_CALL.format("a.py") + "</minimax:tool_call>\n<minimax:tool_call>\n"
     + MINIMAX_CALL.format("b.py") + "</minimax:tool_call>", False),  # a block each: not how its template writes them
    ('<minimax:tool_call>\n<invoke name="write">\n<parameter name="lines">3</parameter>\n</invoke>\n'
     "</minimax:tool_call>", False),  # path is required
    ("<minimax:tool_call>\n" + MINIMAX_CALL.format("a</parameter>") + "</minimax:tool_call>", False),
])
def test_minimax_grammar_holds_its_calls_in_one_block(vocab, text, ok):
    plan = tools.plan(request(tools=[WRITE, FREE], tool_choice="required"), MINIMAX)
    assert accepts(vocab, plan.grammar, text) is ok


def test_minimax_calls_read_back_whole_and_as_they_stream():
    template_tools = native_tools.template_tools(request(tools=[WRITE]))
    text = ('Writing.\n<minimax:tool_call>\n<invoke name="write">\n<parameter name="path">x<y>\n</parameter>\n'
            '<parameter name="lines">3</parameter>\n</invoke>\n<invoke name="write">\n<parameter name="path">b</parameter>\n'
            '</invoke>\n</minimax:tool_call>')
    content, calls, reason = native_answers.read_answer(MINIMAX, text, "stop", template_tools)
    assert content == "Writing." and reason == "tool_calls"
    assert [json.loads(c.function.arguments) for c in calls] == [{"path": "x<y>\n", "lines": 3}, {"path": "b"}]
    reader = native_answers.AnswerReader(MINIMAX, template_tools, stream_calls=True)
    pieces, shown = [], ""
    for i in range(0, len(text), 3):
        shown += reader.push(text[i:i + 3])
        pieces += reader.take_calls()
    rest, whole, _ = reader.finish("stop")
    pieces += reader.take_calls()
    assert (shown + (rest or "")).strip() == "Writing."
    assert [c.function.arguments for c in whole] == [c.function.arguments for c in calls]
    assert "".join(p.arguments for p in pieces if p.index == 0) == calls[0].function.arguments
    assert "".join(p.arguments for p in pieces if p.index == 1) == calls[1].function.arguments
    with pytest.raises(ValueError):
        native_answers.begun_calls(MINIMAX, "<minimax:tool_call>\n" + MINIMAX_CALL.format("a") + "</minimax:tool_call>x")


def test_minimax_is_told_by_its_block_and_invoke_tags(vocab):
    source = ("{%- set toolcall_begin_token = '<minimax:tool_call>' -%} {{ tools }} "
              "'<invoke name=\"' + tool_call.name + '\">' '</minimax:tool_call>'")
    fmt = native_tools.detect(source, vocab)
    assert fmt.name == "minimax" and fmt.trigger == "<minimax:tool_call>"  # text in SmolLM2's vocabulary
    assert native_tools.detect(source.replace("<invoke name=", "<call name="), vocab) is None
