"""api/call_stream.py: tool calls streamed as they are written, in every format, adding up to
the calls read whole."""

from __future__ import annotations

import json

import pytest

from appliance.api import native_answers, tools
from appliance.api.call_stream import compact_json, elements, members, value_end
from appliance.api.native_tools import NativeFormat

HERMES = NativeFormat("hermes", 7)
QWEN3_CODER = NativeFormat("qwen3-coder", 7)
MISTRAL = NativeFormat("mistral", 8)
MISTRAL_ARGS = NativeFormat("mistral-args", 8, 7, 6)
LLAMA3 = NativeFormat("llama3")
LLAMA3_TAGGED = NativeFormat("llama3", tag_tokens=(9,))
GEMMA4 = NativeFormat("gemma4", 9, close_token=10, quote_token=11)
FUNCTIONGEMMA = NativeFormat("functiongemma", 9, close_token=10)
LFM2 = NativeFormat("lfm2", 9, close_token=10)
GLM = NativeFormat("glm", 7)
GRANITE = NativeFormat("granite", 9)
NEMOTRON = NativeFormat("nemotron", 9, close_token=10)
COMMAND_R = NativeFormat("command-r", 9, close_token=10)
MINICPM5 = NativeFormat("minicpm5", trigger_text='<function name="')
APERTUS = NativeFormat("apertus", 9, close_token=10)
GIGACHAT = NativeFormat("gigachat", 9)
APRIEL = NativeFormat("apriel", trigger_text="<tool_calls>")
SEED_OSS = NativeFormat("seed-oss", 9, tag_tokens=(10,))
KIMI = NativeFormat("kimi-k2", 9, 10, close_token=11, tag_tokens=(12, 13))
DEEPSEEK = NativeFormat("deepseek-r1", trigger_text="<｜tool▁calls▁begin｜>")
WRITE = [{"type": "function", "function": {"name": "write", "parameters": {"type": "object", "properties": {
    "path": {"type": "string"}, "lines": {"type": "integer"}, "text": {"type": "string"}}}}}]

ANSWERS = [
    (None, '{"tool_calls": [{"name": "w", "arguments": {"city": "Oslo", "n": [1, 2]}},\n'
           ' {"name": "write", "arguments": {"text": "a \\"b\\"\\n"}}]}', None),
    (HERMES, 'Looking.\n<tool_call>\n{"name": "w", "arguments": {"city":  "Oslo"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "w", "arguments": {"city": "Rome, \\u00e9"}}\n</tool_call>', "Looking."),
    (MISTRAL, '[TOOL_CALLS][{"name": "w", "arguments": {"city": "Oslo"}}, {"name": "w", "arguments": {}, '
              '"id": "abcDEF123"}]', None),
    (MISTRAL_ARGS, '[TOOL_CALLS]w[ARGS]{"city": "Oslo"}[TOOL_CALLS]w[CALL_ID]abcDEF123[ARGS]{"city": "Rome"}', None),
    (LLAMA3, '{"name": "w", "parameters": {"city": "Oslo"}}', None),
    (QWEN3_CODER, "Writing.\n<tool_call>\n<function=write>\n<parameter=lines>\n2\n</parameter>\n<parameter=text>\n"
                  'one "1"\ntwo\n\n</parameter>\n<parameter=path>\na.py\n</parameter>\n</function>\n</tool_call>',
     "Writing."),
    (GEMMA4, '<|tool_call>call:w{city:<|"|>Oslo, NO<|"|>}<tool_call|><|tool_call>call:w{city:<|"|>Rome<|"|>}'
             '<tool_call|>', None),
    (FUNCTIONGEMMA, "<start_function_call>call:w{city:<escape>Oslo<escape>,n:[1,2]}<end_function_call>", None),
    (LFM2, 'Sure.<|tool_call_start|>[w(city="Oslo", n=[1, 2]), write(text="a\\nb")]<|tool_call_end|>', "Sure."),
    (GRANITE, 'Sure.<|tool_call|>[{"name": "w", "arguments": {"city": "Oslo"}}, {"name": "write", "arguments": '
              '{"text": "a"}}]', "Sure."),
    (NEMOTRON, 'On it.\n<TOOLCALL>[{"name": "w", "arguments": {"city": "Oslo"}}, {"name": "write", "arguments": '
               '{"text": "a"}}]</TOOLCALL>', "On it."),
    (COMMAND_R, '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "w", "parameters": {"city": "Oslo"}},\n'
                '    {"tool_call_id": "1", "tool_name": "write", "parameters": {"text": "a"}}\n]<|END_ACTION|>', None),
    (GLM, "<tool_call>write\n<arg_key>lines</arg_key>\n<arg_value>2</arg_value>\n<arg_key>text</arg_key>\n"
          "<arg_value>one\ntwo</arg_value>\n</tool_call>", None),
    (APERTUS, 'Both.<|tools_prefix|>[{"w": {"city": "Oslo"}}, {"write": {"text": "a\\nb", "lines": 2}}]'
              '<|tools_suffix|>', "Both."),
    (APRIEL, 'Done.\n<tool_calls>[{"name": "w", "arguments": {"city": "Oslo"}, "id": "call_7"}, {"name": "write", '
             '"arguments": {"text": "a"}}]</tool_calls>', "Done."),
    (SEED_OSS, "Let me write.\n<seed:tool_call>\n<function=write>\n<parameter=lines>2</parameter>\n<parameter=text>one "
               '"1"\ntwo\n</parameter>\n</function>\n</seed:tool_call>\n<seed:tool_call>\n<function=w>\n'
               "<parameter=city>Oslo</parameter>\n</function>\n</seed:tool_call>", "Let me write."),
    (KIMI, 'On it.<|tool_calls_section_begin|><|tool_call_begin|>functions.w:0<|tool_call_argument_begin|>{"city": '
           '"Oslo"}<|tool_call_end|><|tool_call_begin|>functions.write:1<|tool_call_argument_begin|>{"text": "a\\nb", '
           '"lines": 2}<|tool_call_end|><|tool_calls_section_end|>', "On it."),
    (DEEPSEEK, 'Both.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>w\n```json\n{"city": "Oslo ```"}\n'
               '```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>write\n```json\n{"text": "a\\nb", '
               '"lines": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>', "Both."),
    (GIGACHAT, 'Looking.<|function_call|>{"name": "write", "arguments": {"text": "a\\nb", "lines": 2}}', "Looking."),
    (MINICPM5, 'Writing.\n<function name="write"><param name="lines">2</param><param name="text"><![CDATA[a </param>\n'
               '<function name="x"> & b]]></param><param name="path">a.py</param></function>\n'
               '<function name="w"><param name="city">Oslo</param></function>', "Writing."),
    (LLAMA3_TAGGED, '<|python_tag|>{"name": "w", "parameters": {"city": "Oslo"}}', None),
]


def reader_of(fmt: NativeFormat | None, stream_calls: bool = True):
    if fmt is None:
        return tools.AnswerReader(stream_calls)
    return native_answers.AnswerReader(fmt, WRITE, stream_calls)


def read(fmt: NativeFormat | None, text: str, reason: str = "stop"):
    return tools.read_answer(text, reason) if fmt is None else native_answers.read_answer(fmt, text, reason, WRITE)


def stream(fmt, text: str, size: int, reason: str = "stop"):
    reader, content, deltas = reader_of(fmt), "", []
    for i in range(0, len(text), size):
        content += reader.push(text[i:i + size])
        deltas += [(i, d) for d in reader.take_calls()]
    rest, calls, got_reason = reader.finish(reason)
    deltas += [(len(text), d) for d in reader.take_calls()]
    return content + (rest or ""), calls, got_reason, deltas


@pytest.mark.parametrize("size", [1, 3, 8])
@pytest.mark.parametrize(("fmt", "text", "content"), ANSWERS, ids=lambda v: getattr(v, "name", None))
def test_streamed_calls_add_up_to_the_calls_read_whole(fmt, text, content, size):
    whole_content, whole_calls, whole_reason = read(fmt, text)
    got_content, calls, reason, deltas = stream(fmt, text, size)
    assert whole_reason == reason == "tool_calls" and whole_content == content and (got_content or None) == content
    assert [c.function.name for c in calls] == [c.function.name for c in whole_calls]
    assert [c.function.arguments for c in calls] == [c.function.arguments for c in whole_calls]
    for k, call in enumerate(calls):
        mine = [d for _, d in deltas if d.index == k]
        assert mine[0].id == call.id and mine[0].name == call.function.name  # the first names the call
        assert all(d.id is None and d.name is None for d in mine[1:])
        assert "".join(d.arguments for d in mine) == call.function.arguments
        json.loads(call.function.arguments)
    if fmt is MISTRAL_ARGS:
        assert calls[1].id == "abcDEF123"


@pytest.mark.parametrize(("fmt", "text", "content"),
                         [a for a in ANSWERS if a[0] in (None, HERMES, MISTRAL_ARGS, LLAMA3, LLAMA3_TAGGED, QWEN3_CODER, GLM, GRANITE,
                                                         LFM2, DEEPSEEK)],
                         ids=lambda v: getattr(v, "name", None))
def test_arguments_go_out_while_the_call_is_written(fmt, text, content):
    *_, deltas = stream(fmt, text, 1)
    first = [(at, d) for at, d in deltas if d.index == 0]
    assert first[0][0] < text.index({QWEN3_CODER: "<parameter=lines", GLM: "<arg_key>lines"}.get(fmt, "city"))
    assert len({at for at, d in first if d.arguments}) > 3  # the arguments in many pieces, as they come


def test_a_qwen3_coder_string_streams_as_its_text_comes_and_never_holds_its_closing_newline():
    text = ANSWERS[5][1]
    cut = text.index("two") + 3
    reader = reader_of(QWEN3_CODER)
    reader.push(text[:cut])
    so_far = "".join(d.arguments for d in reader.take_calls())
    assert so_far == '{"lines": 2, "text": "one \\"1\\"\\ntwo'
    reader.push("\n")
    assert reader.take_calls() == []  # this newline may be the one before </parameter>
    reader.push("\n</para")
    assert "".join(d.arguments for d in reader.take_calls()) == "\\n"


def test_mistral_calls_go_out_once_whole_for_the_id_that_may_follow_their_arguments():
    text = ANSWERS[2][1]
    reader = reader_of(MISTRAL)
    reader.push(text[:text.index('"id"')])
    out = reader.take_calls()
    assert [d.index for d in out] == [0] and out[0].arguments == '{"city": "Oslo"}'
    reader.push(text[text.index('"id"'):])
    assert reader.take_calls()[0].id == "abcDEF123"


def test_a_call_cut_short_stays_a_call_once_it_went_out_and_is_text_when_read_whole():
    text = '<tool_call>\n{"name": "w", "arguments": {"city": "Os'
    content, calls, reason, deltas = stream(HERMES, text, 5, reason="length")
    assert content == "" and reason == "length"
    assert [(c.function.name, c.function.arguments) for c in calls] == [("w", '{"city": "Os')]
    assert native_answers.read_answer(HERMES, text, "length") == (text, None, "length")
    reader = reader_of(HERMES, stream_calls=False)
    reader.push(text)
    assert reader.take_calls() == [] and reader.finish("length") == (text, None, "length")


def test_a_direct_answer_has_no_calls_and_a_call_before_its_name_is_whole_has_none_yet():
    reader = reader_of(None)
    assert reader.push('{"response": "Hi, {\\"name\\": 1}"}') == 'Hi, {"name": 1}'
    assert reader.take_calls() == [] and reader.finish("stop") == ("", None, "stop")
    reader = reader_of(None)
    reader.push('{"tool_calls": [{"name": "wri')
    assert reader.take_calls() == []
    reader.push('te", "arguments": {')
    assert [(d.name, d.arguments) for d in reader.take_calls()] == [("write", "{")]


def test_compact_json_is_json_dumps_form_and_grows_with_its_text():
    raw = '{ "a" :\n [1 ,2],"b":{ }, "c": "x , y\\"" }'
    assert compact_json(raw) == json.dumps(json.loads(raw))
    assert all(compact_json(raw).startswith(compact_json(raw[:n])) for n in range(len(raw)))


def test_the_scanners_read_a_text_cut_anywhere():
    text = '{"a": [1, {"b": "]}"}], "c": tru'
    found, end = members(text, 0)
    assert end is None and found["a"] == (6, 22) and found["c"] == (29, None)
    assert value_end(text, 6) == 22 and value_end("12", 0) is None and value_end("12,", 0) == 2
    assert elements("[1, [2], ", 0) == ([(1, 2), (4, 7)], None)
    with pytest.raises(ValueError):
        members("[1]", 0)


@pytest.mark.parametrize("fmt", [None, HERMES, QWEN3_CODER], ids=lambda f: getattr(f, "name", "eie"))
def test_a_long_call_is_read_again_only_as_it_grows_by_a_share_of_itself(fmt):
    body = "def f(x):\n    return x * 2  # \"q\"\n" * 600  # 22 KB
    text = {None: json.dumps({"tool_calls": [{"name": "write", "arguments": {"text": body}}]}),
            HERMES: "<tool_call>\n" + json.dumps({"name": "write", "arguments": {"text": body}}) + "\n</tool_call>",
            QWEN3_CODER: f"<tool_call>\n<function=write>\n<parameter=text>\n{body}\n</parameter>\n</function>\n</tool_call>"}[fmt]
    _, calls, _, deltas = stream(fmt, text, 4)
    assert "".join(d.arguments for _, d in deltas) == calls[0].function.arguments == json.dumps({"text": body})
    pieces = len(text) // 4
    assert len(deltas) < pieces // 3  # every piece up to 4 KB, then once the text grew by 1/256 (or 250 ms passed)


def test_lfm2_arguments_stream_as_json_and_a_word_goes_out_once_whole():
    reader = reader_of(LFM2)
    reader.push('<|tool_call_start|>[write(lines=2, text="a", on=Tru')
    assert "".join(d.arguments for d in reader.take_calls()) == '{"lines": 2, "text": "a", "on": '
    reader.push("e, n=[1, 2.5e3, None]")
    assert "".join(d.arguments for d in reader.take_calls()) == 'true, "n": [1, 2.5e3, null]'
    reader.push(")]<|tool_call_end|>")
    _, calls, _ = reader.finish("stop")
    assert "".join(d.arguments for d in reader.take_calls()) == "}"
    assert calls[0].function.arguments == '{"lines": 2, "text": "a", "on": true, "n": [1, 2.5e3, null]}'
