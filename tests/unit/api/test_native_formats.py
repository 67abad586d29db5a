"""api/native_tools.py's pure parts: which format a template and vocabulary have, each format's
grammar, answers read back whole and as they stream, Mistral's call ids."""

from __future__ import annotations

import json
import re

import msgspec
import pytest

from appliance.api import native_answers, native_tools, tools
from appliance.api.errors import ApiError
from appliance.api.native_tools import NativeFormat
from appliance.api.schemas import ChatMessage, ChatRequest, FunctionCall, ToolCall
from appliance.engine import grammar

WEATHER = {"type": "function", "function": {"name": "w", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CALL = '<tool_call>\n{"name": "w", "arguments": {"city": "Oslo"}}\n</tool_call>'


def request(**kw) -> ChatRequest:
    return msgspec.convert({"model": "m", "messages": [{"role": "user", "content": "hi"}], **kw}, ChatRequest)


HERMES = NativeFormat("hermes", 7)
QWEN3_CODER = NativeFormat("qwen3-coder", 7)
GLM = NativeFormat("glm", 7)
LFM2 = NativeFormat("lfm2", 9, close_token=10)
HERMES_SOURCE = '{{ tools }} <tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
MISTRAL = NativeFormat("mistral", 8)
MISTRAL_ARGS = NativeFormat("mistral-args", 8, 7, 6)
LLAMA3 = NativeFormat("llama3")
LLAMA3_TAGGED = NativeFormat("llama3", tag_tokens=(9,))  # its vocabulary has <|python_tag|>
GEMMA4 = NativeFormat("gemma4", 9, close_token=10, quote_token=11)
FUNCTIONGEMMA = NativeFormat("functiongemma", 9, close_token=10)  # its <escape> as text


class FakeVocab:
    """Tokenizes the texts in `special` as one token each, anything else as one token a character."""

    def __init__(self, *special: str):
        self.special = special

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool) -> list[int]:
        return [100 + self.special.index(text)] if text in self.special else [ord(c) for c in text]


@pytest.mark.parametrize(("template", "vocab", "expected"), [
    (HERMES_SOURCE, FakeVocab("<tool_call>"), NativeFormat("hermes", 100)),
    ("{{- '<tool_call>\\n{\"name\": <function-name>' }} </tool_call> {{ tools }}", FakeVocab("<tool_call>"),
     NativeFormat("hermes", 100)),  # the JSON written in a Jinja string
    (HERMES_SOURCE, FakeVocab(), NativeFormat("hermes", trigger_text="<tool_call>")),  # no such token: the tag as text
    ("{{ tools }} <tool_call>\n<function=f>\n<parameter=p>\n1\n</parameter>\n</function>\n</tool_call>",
     FakeVocab("<tool_call>"), NativeFormat("qwen3-coder", 100)),
    ("{{ tools }} <tool_call>f\n<arg_key>p</arg_key>\n<arg_value>1</arg_value>\n</tool_call>",
     FakeVocab("<tool_call>"), NativeFormat("glm", 100)),
    ("{{ tools }} <tool_call>f<arg_key>p</arg_key><arg_value>1</arg_value></tool_call>",
     FakeVocab("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"),
     NativeFormat("glm", 100, tag_tokens=(101, 102, 103, 104, 105))),  # its tags written out where they are tokens
    ("{{ tools }} <tool_call>f<arg_key>p</arg_key><arg_value>1</arg_value></tool_call>", FakeVocab(),
     NativeFormat("glm", trigger_text="<tool_call>")),
    ("{{ tools }} <tool_call>f\n<invoke>p</invoke>\n</tool_call>",
     FakeVocab("<tool_call>"), None),  # another body inside the tags: not read here
    ("{{ tools }} [TOOL_CALLS][", FakeVocab("[TOOL_CALLS]"), NativeFormat("mistral", 100)),
    ("{{ tools }} [TOOL_CALLS] [ARGS]", FakeVocab("[TOOL_CALLS]", "[ARGS]"), NativeFormat("mistral-args", 100, 101)),
    ("{{ tools }} [TOOL_CALLS] [CALL_ID] [ARGS]", FakeVocab("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"),
     NativeFormat("mistral-args", 100, 101, 102)),
    ("{{ tools }} [TOOL_CALLS] [ARGS]", FakeVocab("[TOOL_CALLS]"), None),
    ('{{ tools }} Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}',
     FakeVocab(), LLAMA3),
    ('{{ tools }} Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}',
     FakeVocab("<|python_tag|>"), NativeFormat("llama3", tag_tokens=(100,))),
    ("{{ tools }} <|tool_call>call:", FakeVocab("<|tool_call>", "<tool_call|>", '<|"|>'),
     NativeFormat("gemma4", 100, close_token=101, quote_token=102)),
    ("{{ tools }} <|tool_call>call:", FakeVocab("<|tool_call>", "<tool_call|>"),
     NativeFormat("gemma4", 100, close_token=101)),  # the string mark as text
    ("{{ tools }} <|tool_call>call:", FakeVocab("<|tool_call>"), None),
    ("{{ tools }} <start_function_call>", FakeVocab("<start_function_call>", "<end_function_call>", "<escape>"),
     NativeFormat("functiongemma", 100, close_token=101, quote_token=102)),
    ("[TOOL_CALLS] <tool_call> </tool_call>", FakeVocab("[TOOL_CALLS]", "<tool_call>"), None),  # no tools variable
    ('{{ tools }} "List of tools: <|tool_list_start|>["', FakeVocab("<|tool_call_start|>", "<|tool_call_end|>"),
     NativeFormat("lfm2", 100, close_token=101)),
    ('{{ tools }} "List of tools: ["', FakeVocab("<|tool_call_start|>"), None),
    ("{{ tools }} <|start|>assistant to=functions.f<|channel|>commentary json<|message|>{}<|call|>",
     FakeVocab("<|channel|>", "<|message|>", "<|start|>", "<|end|>", "<|constrain|>"),
     NativeFormat("harmony", tag_tokens=(100, 101, 102, 103, 104))),
    ("{{ tools }} <|channel|>commentary <|call|>", FakeVocab("<|channel|>", "<|message|>"), None),
    ("{{ tools }} respond only with <|tool_call|> followed by a JSON list", FakeVocab("<|tool_call|>"),
     NativeFormat("granite", 100)),
    ("{{ tools }} <TOOLCALL>[...]</TOOLCALL>", FakeVocab("<TOOLCALL>", "</TOOLCALL>"),
     NativeFormat("nemotron", 100, close_token=101)),
    ("{{ tools }} <TOOLCALL>[...]</TOOLCALL>", FakeVocab("<TOOLCALL>"), NativeFormat("nemotron", 100)),
    ("{{ tools }} <|START_ACTION|> ... <|END_ACTION|>", FakeVocab("<|START_ACTION|>", "<|END_ACTION|>"),
     NativeFormat("command-r", 100, close_token=101)),
    ("{{ tools }} <|tools_prefix|>[...]<|tools_suffix|>", FakeVocab("<|tools_prefix|>", "<|tools_suffix|>"),
     NativeFormat("apertus", 100, close_token=101)),
    ("{{ tools }} <|tools_prefix|>[...]<|tools_suffix|>", FakeVocab(), None),
    ("{{ tools }} '<tool_calls>[' ~ calls ~ ']</tool_calls>'", FakeVocab(), NativeFormat("apriel", trigger_text="<tool_calls>")),
    ("{%- set toolcall_begin_token = '<seed:tool_call>' -%} {%- set toolcall_end_token = '</seed:tool_call>' -%} {{ tools }}",
     FakeVocab("<seed:tool_call>", "</seed:tool_call>"), NativeFormat("seed-oss", 100, tag_tokens=(101,))),
    ("{{ tools }} <seed:tool_call> <function=f> </seed:tool_call>", FakeVocab(),
     NativeFormat("seed-oss", trigger_text="<seed:tool_call>")),
    ("{{ tools }} '<tool_calls>[' ~ calls ~ ']</tool_calls>'", FakeVocab("<tool_calls>", "</tool_calls>"),
     NativeFormat("apriel", 100, close_token=101)),  # tokens where the vocabulary has them
    ("{{ tools }} <|tool_calls_section_begin|> <|tool_call_begin|>",
     FakeVocab("<|tool_calls_section_begin|>", "<|tool_call_argument_begin|>", "<|tool_calls_section_end|>",
               "<|tool_call_begin|>", "<|tool_call_end|>"),
     NativeFormat("kimi-k2", 100, 101, close_token=102, tag_tokens=(103, 104))),
    ("{{ tools }} <|tool_calls_section_begin|> <|tool_call_begin|>", FakeVocab("<|tool_calls_section_begin|>"), None),
    ("{{ tools }} '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜>'",
     FakeVocab("<｜tool▁call▁end｜>"), NativeFormat("deepseek-r1", tag_tokens=(100,), trigger_text="<｜tool▁calls▁begin｜>")),
    ("{{ tools }} {%- set add_tokens = namespace(function_call='<|function_call|>') %}", FakeVocab("<|function_call|>"),
     NativeFormat("gigachat", 100)),
    ("""{{ tools }} {{- '<function name="' ~ tool_call.name ~ '">' }} {{- '<param name="' ~ param_name ~ '">' }}""",
     FakeVocab(), NativeFormat("minicpm5", trigger_text='<function name="')),  # its tags are text
])
def test_the_format_is_the_templates_where_the_vocabulary_has_its_tags(template, vocab, expected):
    assert native_tools.detect(template, vocab) == expected


def test_the_grammar_compiles_and_is_lazy_only_under_auto():
    auto = tools.plan(request(tools=[WEATHER]), HERMES)
    assert auto.triggers == (7,) and auto.template_tools == [WEATHER] and auto.instructions == ""
    assert auto.grammar.startswith('root ::= tagged-call ("\\n" tagged-call)*\n')
    grammar.check(None, auto.grammar)
    one = tools.plan(request(tools=[WEATHER], tool_choice="required", parallel_tool_calls=False), HERMES)
    assert one.triggers == () and one.grammar.startswith("root ::= tagged-call\n")
    grammar.check(None, one.grammar)


@pytest.mark.parametrize("fmt", [HERMES, MISTRAL, MISTRAL_ARGS, LLAMA3, QWEN3_CODER, GLM, LFM2, GEMMA4, FUNCTIONGEMMA,
                                 NativeFormat("minicpm5", trigger_text='<function name="'),
                                 NativeFormat("seed-oss", 9), NativeFormat("apertus", 9, close_token=10),
                                 NativeFormat("apriel", trigger_text="<tool_calls>"), NativeFormat("gigachat", 9),
                                 NativeFormat("kimi-k2", 9, 10, close_token=11, tag_tokens=(12, 13)),
                                 NativeFormat("deepseek-r1", trigger_text="<｜tool▁calls▁begin｜>")],
                         ids=lambda f: f.name)
def test_a_bad_parameter_schema_is_named_under_its_tool(fmt):
    bad = {"type": "function", "function": {"name": "x", "parameters": {"type": "object", "properties": {
        "n": {"type": "number", "multipleOf": 3}}}}}
    with pytest.raises(Exception) as e:
        tools.plan(request(tools=[WEATHER, bad]), fmt)
    assert e.value.param == "tools[1].function.parameters.properties.n.multipleOf"


def test_each_formats_grammar_frames_its_calls():
    tools_ = [WEATHER, {"type": "function", "function": {"name": "n", "parameters": {"type": "object", "properties": {
        "k": {"$ref": "#/$defs/k"}}, "$defs": {"k": {"type": "integer"}}}}}]
    mistral = tools.plan(request(tools=tools_), MISTRAL)
    assert mistral.triggers == (8,) and mistral.shown_tokens == (8,)
    assert mistral.grammar.startswith('root ::= <[8]> "[" call ("," " "? call)* "]"\n')
    assert '"\\"id\\""' in mistral.grammar  # a call may carry its id
    args = tools.plan(request(tools=tools_, tool_choice="required", parallel_tool_calls=False), MISTRAL_ARGS)
    assert args.triggers == () and args.shown_tokens == (8, 7, 6)
    lines = args.grammar.splitlines()
    assert lines[0] == "root ::= call"
    assert lines[1] == 'call ::= <[8]> ("w" args-sep args-0-end | "n" args-sep args-1-end)'
    assert lines[2] == "args-sep ::= (<[6]> [a-zA-Z0-9]{9})? <[7]>"
    assert any(line.startswith("args-1-end ::=") for line in lines)  # each tool's arguments, $refs resolved
    assert tools.plan(request(tools=tools_), MISTRAL_ARGS).grammar.startswith("root ::= call+\n")
    llama = tools.plan(request(tools=tools_), LLAMA3)
    assert llama.triggers == () and llama.shown_tokens == ()  # the grammar holds the answer from its start
    assert llama.grammar.startswith("root ::= call | ([^{] [^\\x00]*)?\n")
    assert '"\\"parameters\\""' in llama.grammar and '"\\"arguments\\""' not in llama.grammar
    grammar.check(None, llama.grammar)
    required = tools.plan(request(tools=tools_, tool_choice="required"), LLAMA3)
    assert required.grammar.startswith("root ::= call\n")  # one call: Llama 3.x's templates take no more
    tagged = tools.plan(request(tools=tools_), LLAMA3_TAGGED)
    assert tagged.triggers == () and tagged.shown_tokens == (9,)  # the tag is written out, to be read back
    # a call after <|python_tag|> or without it; text that begins with neither `{` nor `<|`
    assert tagged.grammar.startswith('root ::= <[9]>? call | ([^{<] [^\\x00]* | "<" ([^|] [^\\x00]*)?)?\n')
    grammar.check(None, tagged.grammar)
    required = tools.plan(request(tools=tools_, tool_choice="required"), LLAMA3_TAGGED)
    assert required.grammar.startswith("root ::= <[9]>? call\n")
    # with a response_format under auto: a call (after the tag or not) or that format's JSON, no free text
    reply = tools.plan(request(tools=tools_), LLAMA3_TAGGED, reply='root ::= "{" "}"')
    assert reply.reply and reply.triggers == ()
    assert reply.grammar.startswith("root ::= calls-root | reply-root\ncalls-root ::= <[9]>? calls-call\n")
    assert reply.grammar.endswith('reply-root ::= "{" "}"')
    grammar.check(None, reply.grammar)
    hermes = tools.plan(request(tools=tools_), HERMES, reply='root ::= "{" "}"')
    assert hermes.triggers == () and hermes.grammar.startswith("root ::= calls-root | reply-root\ncalls-root ::= ")
    grammar.check(None, hermes.grammar)
    with pytest.raises(ApiError) as refused:
        tools.plan(request(tools=tools_), NativeFormat("harmony", tag_tokens=(1, 2, 3, 4, 5)), reply='root ::= "{" "}"')
    assert refused.value.param == "response_format"


def test_answers_are_read_into_content_and_calls():
    content, calls, reason = native_answers.read_answer(HERMES, "Let me look.\n" + CALL + "\n" + CALL, "stop")
    assert content == "Let me look." and reason == "tool_calls" and len(calls) == 2
    assert calls[0].function.name == "w" and json.loads(calls[0].function.arguments) == {"city": "Oslo"}
    assert calls[0].id.startswith("call_")
    assert native_answers.read_answer(HERMES, CALL, "stop")[0] is None
    assert native_answers.read_answer(HERMES, "plain", "stop") == ("plain", None, "stop")
    assert native_answers.read_answer(HERMES, CALL[:30], "length") == (CALL[:30], None, "length")  # cut short: as it is
    broken = '<tool_call>\n{"name": "w"}\n</tool_call>'  # no arguments: not a call
    assert native_answers.read_answer(HERMES, broken, "stop") == (broken, None, "stop")


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), [
    (MISTRAL, '[TOOL_CALLS][{"name": "w", "arguments": {"city": "Oslo"}}, {"name": "w", "arguments": {"city": "Rome"}, '
              '"id": "abcDEF123"}]', None, [("w", {"city": "Oslo"}, None), ("w", {"city": "Rome"}, "abcDEF123")]),
    (MISTRAL, 'Looking.[TOOL_CALLS][{"name": "w", "arguments": {}}]', "Looking.", [("w", {}, None)]),
    (MISTRAL_ARGS, '[TOOL_CALLS]w[ARGS]{"city": "Oslo"}[TOOL_CALLS]w[CALL_ID]abcDEF123[ARGS]{"city": "Rome"}', None,
     [("w", {"city": "Oslo"}, None), ("w", {"city": "Rome"}, "abcDEF123")]),
    (LLAMA3, '{"name": "w", "parameters": {"city": "Oslo"}}', None, [("w", {"city": "Oslo"}, None)]),
    (LLAMA3, '\n {"name": "w", "arguments": {"city": "Oslo"}} ', None, [("w", {"city": "Oslo"}, None)]),
    (LLAMA3, 'It is {"name": "w"}', 'It is {"name": "w"}', None),  # not at the start: text
    (LLAMA3, '{"name": "w"}', '{"name": "w"}', None),  # no arguments: text
    (LLAMA3_TAGGED, '<|python_tag|>{"name": "w", "parameters": {"city": "Oslo"}}', None, [("w", {"city": "Oslo"}, None)]),
    (LLAMA3_TAGGED, ' <|python_tag|> {"name": "w", "parameters": {}}', None, [("w", {}, None)]),
    (LLAMA3_TAGGED, '<|python_tag|>print(1)', '<|python_tag|>print(1)', None),  # a built-in tool's code: text
    (GEMMA4, 'Sure.<|tool_call>call:w{city:<|"|>Oslo, NO<|"|>}<tool_call|><|tool_call>call:w{city:<|"|>Rome<|"|>}'
             '<tool_call|>', "Sure.", [("w", {"city": "Oslo, NO"}, None), ("w", {"city": "Rome"}, None)]),
    (GEMMA4, "<|tool_call>call:w{city:Oslo}<tool_call|>", "<|tool_call>call:w{city:Oslo}<tool_call|>", None),
    (FUNCTIONGEMMA, "<start_function_call>call:w{city:<escape>Oslo, NO<escape>,n:[1,2]}<end_function_call>", None,
     [("w", {"city": "Oslo, NO", "n": [1, 2]}, None)]),
    (MISTRAL, "[TOOL_CALLS][{]", "[TOOL_CALLS][{]", None),  # does not read: the text as it is
    (MISTRAL_ARGS, "[TOOL_CALLS]w{}", "[TOOL_CALLS]w{}", None),
])
def test_each_format_is_read_back(fmt, text, content, calls):
    got_content, got, reason = native_answers.read_answer(fmt, text, "stop")
    assert got_content == content
    if calls is None:
        assert got is None and reason == "stop"
        return
    assert reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in got] == [c[:2] for c in calls]
    for call, (_, _, call_id) in zip(got, calls):
        if call_id is not None:
            assert call.id == call_id  # the id the model wrote
        elif fmt in (LLAMA3, LLAMA3_TAGGED, GEMMA4, FUNCTIONGEMMA):
            assert call.id.startswith("call_")
        else:
            assert re.fullmatch("[a-zA-Z0-9]{9}", call.id)  # Mistral's templates take no other


def test_mistral_ids_are_nine_letters_and_digits_and_stable():
    assert native_tools.mistral_id("abcDEF123") == "abcDEF123"
    made = native_tools.mistral_id("call_1")
    assert re.fullmatch("[a-zA-Z0-9]{9}", made) and made == native_tools.mistral_id("call_1")
    assert made != native_tools.mistral_id("call_2")


@pytest.mark.parametrize("cut", [1, 3, 12, 14])
def test_a_streamed_answer_gives_out_its_text_and_never_the_tag(cut):
    text = "Sure <tool>.\n" + CALL
    reader = native_answers.AnswerReader(HERMES)
    out = "".join(reader.push(text[i:i + cut]) for i in range(0, len(text), cut))
    content, calls, reason = reader.finish("stop")
    assert out + (content or "") == "Sure <tool>."
    assert reason == "tool_calls" and calls[0].function.name == "w"
    reader = native_answers.AnswerReader(HERMES)
    out = "".join(reader.push(p) for p in ("a <tool_c", "at> b\n"))
    assert out + (reader.finish("stop")[0] or "") == "a <tool_cat> b\n"  # not the tag after all


@pytest.mark.parametrize("cut", [1, 2, 5])
def test_a_streamed_mistral_answer_never_gives_out_its_tag(cut):
    text = "Sure [TOOLS].[TOOL_CALLS][{\"name\": \"w\", \"arguments\": {\"city\": \"Oslo\"}}]"
    reader = native_answers.AnswerReader(MISTRAL)
    out = "".join(reader.push(text[i:i + cut]) for i in range(0, len(text), cut))
    content, calls, reason = reader.finish("stop")
    assert out + (content or "") == "Sure [TOOLS]." and reason == "tool_calls"


@pytest.mark.parametrize("cut", [1, 3])
def test_a_streamed_llama3_answer_is_held_only_when_it_begins_as_a_call(cut):
    call = '\n{"name": "w", "parameters": {"city": "Oslo"}}'
    reader = native_answers.AnswerReader(LLAMA3)
    assert "".join(reader.push(call[i:i + cut]) for i in range(0, len(call), cut)) == ""
    assert reader.finish("stop")[1][0].function.name == "w"
    text = "\nIt is sunny {really}."
    reader = native_answers.AnswerReader(LLAMA3)
    out = "".join(reader.push(text[i:i + cut]) for i in range(0, len(text), cut))
    content, calls, reason = reader.finish("stop")
    assert out == text and content == "" and calls is None and reason == "stop"



@pytest.mark.parametrize("cut", [1, 3, 20])
def test_a_streamed_llama3_call_after_its_python_tag_never_gives_out_the_tag(cut):
    call = '<|python_tag|>{"name": "w", "parameters": {"city": "Oslo"}}'
    reader = native_answers.AnswerReader(LLAMA3_TAGGED)
    assert "".join(reader.push(call[i:i + cut]) for i in range(0, len(call), cut)) == ""
    content, calls, reason = reader.finish("stop")
    assert content is None and reason == "tool_calls" and calls[0].function.name == "w"
    text = "<b>Sunny</b>, <|ok"  # begins as the tag would, then does not
    reader = native_answers.AnswerReader(LLAMA3_TAGGED)
    out = "".join(reader.push(text[i:i + cut]) for i in range(0, len(text), cut))
    content, calls, reason = reader.finish("stop")
    assert out + content == text and calls is None and reason == "stop"


def test_results_without_ids_answer_the_calls_in_turn():
    calls = [ToolCall(id=f"call_{k}", function=FunctionCall(name, "{}")) for k, name in enumerate(("a", "b", "c"))]
    raw = [ChatMessage("user", "hi"), ChatMessage("assistant", None, tool_calls=calls),
           ChatMessage("tool", "B", name="b"), ChatMessage("tool", "A"), ChatMessage("tool", "C", tool_call_id="call_2")]
    plain = [{"role": m.role, "content": m.content or ""} for m in raw]
    out = native_tools.conversation(MISTRAL, plain, raw)
    ids = [c["id"] for c in out[1]["tool_calls"]]
    assert ids == [native_tools.mistral_id(f"call_{k}") for k in range(3)]
    assert [m["tool_call_id"] for m in out[2:]] == [ids[1], ids[0], ids[2]]  # by name, then in turn
    assert native_tools.conversation(HERMES, plain, raw)[3]["tool_call_id"] == "call_0"  # ids kept as they are


ADD = {"type": "function", "function": {"name": "add", "parameters": {"type": "object", "properties": {
    "a": {"type": "integer"}, "b": {"type": "integer"}, "note": {"type": "string"}, "tags": {"type": "array"}},
    "required": ["a", "b"]}}}


def test_qwen3_coder_grammar_writes_strings_as_text_and_other_values_as_json():
    plan = tools.plan(request(tools=[WEATHER, ADD, {"type": "function", "function": {"name": "free"}}]), QWEN3_CODER)
    assert plan.triggers == (7,)
    lines = plan.grammar.splitlines()
    assert lines[0] == 'root ::= tagged-call ("\\n" tagged-call)*'
    assert lines[3] == 'call-0 ::= "<function=w>\\n" "<parameter=city>\\n" xml-text "\\n</parameter>\\n" "</function>"'
    assert lines[4].startswith('call-1 ::= "<function=add>\\n" "<parameter=a>\\n" integer-end "\\n</parameter>\\n" ')
    assert '("<parameter=note>\\n" xml-text "\\n</parameter>\\n")?' in lines[4]  # optional: may be left out
    assert lines[5] == 'call-2 ::= "<function=free>\\n" xml-any-parameter* "</function>"'
    grammar.check(None, plan.grammar)


def test_qwen3_coder_values_are_read_by_their_schemas():
    req = request(tools=[WEATHER, ADD])
    text = ("Adding.\n<tool_call>\n<function=add>\n<parameter=a>\n2\n</parameter>\n<parameter=b>\n-3\n</parameter>\n"
            "<parameter=note>\n42\n</parameter>\n<parameter=tags>\n[\"x\"]\n</parameter>\n</function>\n</tool_call>\n"
            "<tool_call>\n<function=w>\n<parameter=city>\nNew\nYork </parameter>\n</function>\n</tool_call>")
    content, calls, reason = native_answers.read_answer(QWEN3_CODER, text, "stop", native_tools.template_tools(req))
    assert content == "Adding." and reason == "tool_calls"
    assert json.loads(calls[0].function.arguments) == {"a": 2, "b": -3, "note": "42", "tags": ["x"]}
    assert json.loads(calls[1].function.arguments) == {"city": "New\nYork "}  # a string's text as it is
    assert native_answers.read_answer(QWEN3_CODER, "<tool_call>\n{}\n</tool_call>", "stop")[1] is None
    reader = native_answers.AnswerReader(QWEN3_CODER, native_tools.template_tools(req))
    out = "".join(reader.push(text[i:i + 4]) for i in range(0, len(text), 4))
    rest, calls, _ = reader.finish("stop")
    assert out + (rest or "") == "Adding." and len(calls) == 2


def test_gemma4_grammar_frames_each_call_with_its_tags():
    plan = tools.plan(request(tools=[WEATHER, ADD]), GEMMA4)
    assert plan.triggers == (9,) and plan.shown_tokens == (9, 10, 11)
    lines = plan.grammar.splitlines()
    assert lines[:2] == ["root ::= call+", 'call ::= <[9]> "call:" ("w" args-0 | "add" args-1) <[10]>']
    assert 'args-0 ::= "{" "city:" g-string "}"' in lines and "g-string ::= <[11]> g-char* <[11]>" in lines


def test_functiongemmas_grammar_spells_out_its_escape_mark_where_it_is_no_token():
    plan = tools.plan(request(tools=[WEATHER]), FUNCTIONGEMMA)
    lines = plan.grammar.splitlines()
    assert lines[1] == 'call ::= <[9]> "call:" ("w" args-0) <[10]>'
    assert 'g-string ::= "<escape>" g-char* "<escape>"' in lines
    assert 'g-char ::= [^<] | "<" [^e] | "<e" [^s] | "<es" [^c] | "<esc" [^a] | "<esca" [^p] | "<escap" [^e] | "<escape" [^>]' in lines
    grammar.check(None, plan.grammar)


def test_glm_grammar_frames_keys_and_values_with_or_without_newlines():
    plan = tools.plan(request(tools=[WEATHER, ADD, {"type": "function", "function": {"name": "free"}}]), GLM)
    assert plan.triggers == (7,)
    lines = plan.grammar.splitlines()
    assert lines[0] == 'root ::= tagged-call ("\\n"? tagged-call)*'
    assert lines[1] == 'tagged-call ::= "<tool_call>" call "</tool_call>"'
    assert lines[3] == ('call-0 ::= "w" "\\n"? "<arg_key>city</arg_key>" "\\n"? "<arg_value>" xml-text '
                        '"</arg_value>" "\\n"?')
    assert lines[5] == 'call-2 ::= "free" "\\n"? xml-any-parameter*'
    assert any(line.startswith("xml-text ::=") for line in lines)
    grammar.check(None, plan.grammar)


@pytest.mark.parametrize("text", [
    # GLM-4.6's form, and GLM-4.7's without newlines
    "Adding.\n<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>2</arg_value>\n<arg_key>note</arg_key>\n"
    "<arg_value>4 2</arg_value>\n</tool_call><tool_call>w\n<arg_key>city</arg_key>\n<arg_value>New\nYork "
    "</arg_value>\n</tool_call>",
    "Adding.<tool_call>add<arg_key>a</arg_key><arg_value>2</arg_value><arg_key>note</arg_key><arg_value>4 2"
    "</arg_value></tool_call>\n<tool_call>w<arg_key>city</arg_key><arg_value>New\nYork </arg_value></tool_call>",
])
def test_glm_calls_read_back_by_their_schemas_whole_and_streamed(text):
    template_tools = native_tools.template_tools(request(tools=[WEATHER, ADD]))
    content, calls, reason = native_answers.read_answer(GLM, text, "stop", template_tools)
    assert content == "Adding." and reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("add", {"a": 2, "note": "4 2"}), ("w", {"city": "New\nYork "})]  # a string's text as it is
    reader = native_answers.AnswerReader(GLM, template_tools, stream_calls=True)
    out, pieces = "", []
    for i in range(0, len(text), 3):
        out += reader.push(text[i:i + 3])
        pieces += reader.take_calls()
    rest, streamed, _ = reader.finish("stop")
    pieces += reader.take_calls()
    assert out + (rest or "") == "Adding." and [c.function.arguments for c in streamed] == [
        c.function.arguments for c in calls]
    assert "".join(p.arguments for p in pieces if p.index == 1) == calls[1].function.arguments
    assert len([p for p in pieces if p.index == 1]) > 3  # the city's text as it came
    assert native_answers.read_answer(GLM, "<tool_call><arg_key>a</arg_key></tool_call>", "stop")[1] is None


def test_lfm2_calls_are_pythons_keyword_calls_held_to_their_schemas():
    flags = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "on": {"type": "boolean"}, "none": {"type": "null"}, "xs": {"type": "array", "items": {"type": "integer"}}}}}}
    plan = tools.plan(request(tools=[WEATHER, flags]), LFM2)
    assert plan.triggers == (9,) and plan.shown_tokens == (9, 10)
    lines = plan.grammar.splitlines()
    assert lines[0] == 'root ::= <[9]> "[" call ("," " "? call)* "]" <[10]>'
    assert '"True" | "False"' in plan.grammar and '"None"' in plan.grammar and '"true"' not in plan.grammar
    grammar.check(None, plan.grammar)
    text = 'Checking.<|tool_call_start|>[w(city="Oslo, \\"NO\\""), f(on=True, none=None, xs=[1, 2])]<|tool_call_end|>'
    content, calls, reason = native_answers.read_answer(LFM2, text, "stop")
    assert content == "Checking." and reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("w", {"city": 'Oslo, "NO"'}), ("f", {"on": True, "none": None, "xs": [1, 2]})]
    for bad in ("<|tool_call_start|>[w(1)]<|tool_call_end|>", "<|tool_call_start|>[w(city=x)]<|tool_call_end|>",
                "<|tool_call_start|>[__import__('os')]<|tool_call_end|>x"):
        assert native_answers.read_answer(LFM2, bad, "stop")[1] is None  # not keyword calls of literals: text
    odd = {"type": "function", "function": {"name": "g", "parameters": {"type": "object", "properties": {
        "a-b": {"type": "string"}}}}}
    with pytest.raises(Exception) as e:
        tools.plan(request(tools=[odd]), LFM2)
    assert e.value.param == "tools[0].function.parameters.properties.a-b"


def test_lfm2_history_writes_calls_into_the_content():
    calls = [ToolCall(id="call_1", function=FunctionCall("w", '{"city": "Oslo", "ok": true, "n": null}'))]
    raw = [ChatMessage("user", "hi"), ChatMessage("assistant", "Looking.", tool_calls=calls),
           ChatMessage("tool", "cold", tool_call_id="call_1")]
    plain = [{"role": m.role, "content": m.content or ""} for m in raw]
    out = native_tools.conversation(LFM2, plain, raw)
    assert out[1] == {"role": "assistant", "content":
                      'Looking.<|tool_call_start|>[w(city="Oslo", ok=True, n=None)]<|tool_call_end|>'}
    assert out[2]["role"] == "tool" and out[2]["content"] == "cold"


GPT_OSS = NativeFormat("harmony", tag_tokens=(6, 7, 9, 8, 12))


@pytest.mark.parametrize(("text", "thought", "content", "call"), [
    ("<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.w "
     '<|constrain|>json<|message|>{"city": "Oslo"}', "Need the weather.", None, ("w", {"city": "Oslo"})),
    ('<|channel|>commentary to=functions.w <|constrain|>json<|message|>{"city": "Oslo"}', None, None,
     ("w", {"city": "Oslo"})),
    ("<|channel|>analysis<|message|>Just greet.<|end|><|start|>assistant<|channel|>final<|message|>Hello!",
     "Just greet.", "Hello!", None),
])
def test_gpt_oss_answers_split_into_analysis_and_a_call_or_the_final_answer(text, thought, content, call):
    from appliance.api.chat_answer import AnswerShape
    from appliance.engine import reasoning

    plan = tools.plan(request(tools=[WEATHER]), GPT_OSS)
    assert plan.triggers == () and plan.shown_tokens == (6, 7, 9, 8, 12)  # the grammar holds the whole answer
    assert plan.grammar.startswith("root ::= analysis? (call | <[6]> \"final\" <[7]> !<[8]>*)\n")
    grammar.check(None, plan.grammar)
    shape = AnswerShape(plan, reasoning.HARMONY)
    whole = shape.whole(text, "stop")
    assert (whole.reasoning, whole.content) == (thought, content)
    assert ([(c.function.name, json.loads(c.function.arguments)) for c in whole.tool_calls] if call else None) == (
        [call] if call else None)
    reader = shape.reader(stream_calls=True)
    thoughts, texts, pieces = "", "", []
    for i in range(0, len(text), 4):
        t, c = reader.push(text[i:i + 4])
        thoughts, texts, pieces = thoughts + t, texts + c, pieces + reader.take_calls()
    parts = reader.finish("stop")
    pieces += reader.take_calls()
    assert (thoughts + (parts.reasoning or "") or None, texts + (parts.content or "") or None) == (thought, content)
    assert "".join(p.arguments for p in pieces) == (whole.tool_calls[0].function.arguments if call else "")
    named = tools.plan(request(tools=[WEATHER], tool_choice="required"), GPT_OSS, think_budget=64)
    assert named.grammar.startswith("root ::= analysis? (call)\n")
    assert 'analysis ::= <[6]> "analysis" <[7]> !<[8]>{0,64} <[8]> <[9]> "assistant"' in named.grammar  # the budget
    grammar.check(None, named.grammar)


def test_granite_history_writes_calls_into_the_content_as_its_json_list():
    calls = [ToolCall(id="call_1", function=FunctionCall("w", '{"city": "Oslo"}'))]
    raw = [ChatMessage("user", "hi"), ChatMessage("assistant", None, tool_calls=calls), ChatMessage("tool", "cold")]
    plain = [{"role": m.role, "content": m.content or ""} for m in raw]
    out = native_tools.conversation(NativeFormat("granite", 9), plain, raw)
    assert out[1] == {"role": "assistant", "content": '<|tool_call|>[{"name": "w", "arguments": {"city": "Oslo"}}]'}
    plan = tools.plan(request(tools=[WEATHER]), NativeFormat("granite", 9))
    assert plan.grammar.startswith('root ::= <[9]> "[" call ("," " "? call)* "]"\n') and plan.triggers == (9,)
    assert '"\\"id\\""' not in plan.grammar  # Mistral's calls may carry an id; Granite's do not
    grammar.check(None, plan.grammar)


def test_command_r_plans_in_its_thinking_block_then_calls_with_its_own_keys():
    from appliance.api.chat_answer import AnswerShape
    from appliance.engine import reasoning

    fmt = NativeFormat("command-r", 9, close_token=10)
    plan = tools.plan(request(tools=[WEATHER]), fmt)
    assert '"\\"tool_call_id\\""' in plan.grammar and '"\\"tool_name\\""' in plan.grammar
    assert '"\\"parameters\\""' in plan.grammar and plan.triggers == (9,)
    grammar.check(None, plan.grammar)
    text = ('<|START_THINKING|>I will look it up.<|END_THINKING|><|START_ACTION|>[\n    {"tool_call_id": "0", '
            '"tool_name": "w", "parameters": {"city": "Oslo"}}\n]<|END_ACTION|>')
    parts = AnswerShape(plan, reasoning.COMMAND_R).whole(text, "stop")
    assert parts.reasoning == "I will look it up." and parts.content is None and parts.finish_reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in parts.tool_calls] == [("w", {"city": "Oslo"})]
    answer = AnswerShape(None, reasoning.COMMAND_R).whole("<|START_RESPONSE|>It is 4.<|END_RESPONSE|>", "stop")
    assert (answer.reasoning, answer.content) == (None, "It is 4.")  # its response tags are not text


APERTUS = NativeFormat("apertus", 9, close_token=10)


def test_apertus_calls_are_keyed_by_the_function_name_in_a_closed_list():
    plan = tools.plan(request(tools=[WEATHER, ADD], tool_choice="required"), APERTUS)
    lines = plan.grammar.splitlines()
    assert lines[0] == 'root ::= <[9]> "[" call ("," " "? call)* "]" <[10]>'
    assert '"\\"w\\"" ws ":"' in plan.grammar and '"\\"name\\""' not in plan.grammar
    grammar.check(None, plan.grammar)
    text = 'On it.<|tools_prefix|>[{"add": {"a": 1, "b": 2}}, {"w": {"city": "Bern"}}]<|tools_suffix|>'
    content, calls, reason = native_answers.read_answer(APERTUS, text, "stop")
    assert content == "On it." and reason == "tool_calls"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("add", {"a": 1, "b": 2}), ("w", {"city": "Bern"})]
    for bad in ('<|tools_prefix|>[{"add": {"a": 1}, "w": {}}]<|tools_suffix|>',  # two names in one call
                '<|tools_prefix|>[{"add": [1, 2]}]<|tools_suffix|>', '<|tools_prefix|>[{}]<|tools_suffix|>'):
        assert native_answers.read_answer(APERTUS, bad, "stop")[1] is None, bad


def test_apertus_deliberates_in_its_inner_block_then_calls():
    from appliance.api.chat_answer import AnswerShape
    from appliance.engine import reasoning

    assert reasoning.tags_of(" Deliberation <|inner_prefix|> ... <|inner_suffix|>") is reasoning.APERTUS
    plan = tools.plan(request(tools=[WEATHER]), APERTUS)
    text = '<|inner_prefix|>Bern is in Switzerland.<|inner_suffix|><|tools_prefix|>[{"w": {"city": "Bern"}}]<|tools_suffix|>'
    parts = AnswerShape(plan, reasoning.APERTUS).whole(text, "stop")
    assert parts.reasoning == "Bern is in Switzerland." and parts.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in parts.tool_calls] == [("w", {"city": "Bern"})]


def test_gigachat_takes_one_call_after_its_tag():
    fmt = NativeFormat("gigachat", 9)
    plan = tools.plan(request(tools=[WEATHER, ADD]), fmt)  # parallel calls asked for: one all the same
    assert plan.grammar.splitlines()[0] == "root ::= <[9]> call" and plan.triggers == (9,)
    grammar.check(None, plan.grammar)
    text = 'Checking.<|function_call|>{"name": "w", "arguments": {"city": "Riga"}}'
    content, calls, reason = native_answers.read_answer(fmt, text, "stop")
    assert (content, reason) == ("Checking.", "tool_calls") and calls[0].function.name == "w"
    assert native_answers.read_answer(fmt, text + ' {"name": "w"}', "stop")[1] is None  # text after the call


def test_apriel_reasons_then_calls_in_a_list_between_its_tags_written_as_text():
    from appliance.api.chat_answer import AnswerShape
    from appliance.engine import reasoning

    fmt = NativeFormat("apriel", trigger_text="<tool_calls>")
    plan = tools.plan(request(tools=[WEATHER]), fmt)
    assert plan.triggers == ("<tool_calls>",)
    assert plan.grammar.splitlines()[0] == 'root ::= "<tool_calls>" "[" call ("," " "? call)* "]" "</tool_calls>"'
    assert '"\\"id\\""' in plan.grammar  # the model may write the id its history showed it
    grammar.check(None, plan.grammar)
    source = "'Here are my reasoning steps:\\n' ... '[BEGIN FINAL RESPONSE]'"
    assert reasoning.tags_of(source) is reasoning.APRIEL
    text = ('Paris is in France.\n[BEGIN FINAL RESPONSE]\n<tool_calls>[{"name": "w", "arguments": {"city": "Paris"}, '
            '"id": "call_1"}]</tool_calls>')
    parts = AnswerShape(plan, reasoning.APRIEL, inside=True).whole(text, "stop")
    assert parts.reasoning == "Paris is in France." and parts.content is None
    assert [(c.function.name, json.loads(c.function.arguments)) for c in parts.tool_calls] == [("w", {"city": "Paris"})]
    answer = AnswerShape(None, reasoning.APRIEL, inside=True).whole("Easy.\n[BEGIN FINAL RESPONSE]\n4\n[END FINAL RESPONSE]",
                                                                 "stop")
    assert (answer.reasoning, answer.content) == ("Easy.", "4\n")


def test_kimi_numbers_its_calls_in_their_ids_which_stay_their_ids():
    fmt = NativeFormat("kimi-k2", 9, 10, close_token=11, tag_tokens=(12, 13))
    plan = tools.plan(request(tools=[WEATHER, ADD]), fmt)
    lines = plan.grammar.splitlines()
    assert lines[0] == "root ::= <[9]> call+ <[11]>" and plan.triggers == (9,)
    assert lines[1] == ('call ::= <[12]> "functions." ("w" ":" [0-9]{1,4} <[10]> args-0-end | "add" ":" [0-9]{1,4} '
                        '<[10]> args-1-end) <[13]>')
    assert plan.shown_tokens == (9, 10, 11, 12, 13)
    grammar.check(None, plan.grammar)
    text = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.add:3<|tool_call_argument_begin|>"
            '{"a": 1, "b": 2}<|tool_call_end|><|tool_calls_section_end|>')
    _, calls, reason = native_answers.read_answer(fmt, text, "stop")
    assert reason == "tool_calls" and calls[0].id == "functions.add:3" and calls[0].function.name == "add"
    bad = text.replace("functions.add:3", "add")
    assert native_answers.read_answer(fmt, bad, "stop")[1] is None
