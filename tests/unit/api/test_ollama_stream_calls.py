"""Ollama's streamed tool calls (api/ollama_output.OllamaEvents): each call in a piece of its own
once its arguments are whole, in order, none twice; a call cut short is left out."""

from __future__ import annotations

from appliance.api.answer_relay import Ending
from appliance.api.call_stream import CallDelta
from appliance.api.chat_answer import Parts
from appliance.api.ollama_output import OllamaEvents
from appliance.api.schemas import FunctionCall, ToolCall


def ending(calls: list[tuple[str, str]], reason: str) -> Ending:
    tool_calls = [ToolCall(id=f"call_{k}", function=FunctionCall(n, a)) for k, (n, a) in enumerate(calls)]
    return Ending(Parts(None, None, tool_calls or None, reason), 10, 0, 20, 0, None)


def called(events) -> list[tuple[str, dict]]:
    return [(c.function.name, c.function.arguments) for e in events for c in (e.message.tool_calls or [])]


def test_each_call_goes_out_once_its_arguments_are_whole():
    w = OllamaEvents("m", chat=True, logprobs=False)
    assert w.streams_calls
    assert w.calls([CallDelta(0, "call_a", "w", '{"city": "Os')]) == []
    first = w.calls([CallDelta(0, None, None, 'lo"}'), CallDelta(1, "call_b", "add", '{"a": 1, ')])
    assert called(first) == [("w", {"city": "Oslo"})] and first[0].done is False
    second = w.calls([CallDelta(1, None, None, '"b": 2}')])
    assert called(second) == [("add", {"a": 1, "b": 2})]
    end = w.finish(ending([("w", '{"city": "Oslo"}'), ("add", '{"a": 1, "b": 2}')], "tool_calls"))
    assert called(end) == [] and end[-1].done is True  # nothing sent twice
    assert called([w.result]) == [("w", {"city": "Oslo"}), ("add", {"a": 1, "b": 2})]


def test_calls_given_whole_at_the_end_go_out_there_and_a_cut_one_is_left_out():
    w = OllamaEvents("m", chat=True, logprobs=False)
    assert w.calls([CallDelta(0, "call_a", "w", "")]) == []  # arguments that come whole when the call closes
    end = w.finish(ending([("w", '{"city": "Rome"}'), ("add", '{"a": 1')], "length"))
    assert called(end) == [("w", {"city": "Rome"})]
    assert called([w.result]) == [("w", {"city": "Rome"})] and w.result.done_reason == "length"
