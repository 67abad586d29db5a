"""truncation: auto's choice of cut: whole turns, instructions kept, the previous cut kept while
the prompt fits, and a moved cut leaving a quarter of the room for the turns after it."""

from __future__ import annotations

import asyncio

from appliance.api.responses_truncation import choose_cut, kept, turn_starts
from appliance.api.schemas import ChatMessage, FunctionCall, ToolCall

CONVERSATION = [
    ChatMessage("developer", "Be brief."),  # 0
    ChatMessage("user", "one"),  # 1
    ChatMessage("assistant", None, tool_calls=[ToolCall(id="c", function=FunctionCall("f", "{}"))]),  # 2
    ChatMessage("tool", "42", tool_call_id="c"),  # 3
    ChatMessage("assistant", "ONE"),  # 4
    ChatMessage("user", "two"),  # 5
    ChatMessage("assistant", "TWO"),  # 6
    ChatMessage("user", "three"),  # 7
]


def test_a_cut_falls_where_a_turn_starts_and_keeps_the_instructions():
    assert turn_starts(CONVERSATION, 0) == [0, 1, 5, 7]
    assert turn_starts(CONVERSATION, 5) == [5, 7]
    assert [m.content for m in kept(CONVERSATION, 5)] == ["Be brief.", "two", "TWO", "three"]
    assert kept(CONVERSATION, 0) == CONVERSATION


def cut(starts: list[int], sizes: dict[int, int], room: int) -> tuple[int, list[int]]:
    asked: list[int] = []

    async def size(at: int) -> int:
        asked.append(at)
        return sizes[at]

    return asyncio.run(choose_cut(starts, size, room)), asked


def test_the_previous_cut_stays_while_its_prompt_fits():
    sizes = {0: 900, 10: 700, 20: 500, 30: 300, 40: 100}
    assert cut([10, 20, 30, 40], sizes, 700) == (10, [10])  # it fits exactly: one render


def test_a_moved_cut_leaves_a_quarter_of_the_room_free():
    sizes = {0: 1000, 10: 800, 20: 700, 30: 500, 40: 100}
    at, asked = cut([0, 10, 20, 30, 40], sizes, 720)
    assert at == 30  # 700 would fit 720, but only 500 leaves 180 of it free
    assert len(asked) <= 4  # by halves, not one turn at a time


def test_without_a_quarter_free_the_first_that_fits_and_else_the_last():
    assert cut([0, 10, 20], {0: 1000, 10: 700, 20: 650}, 700)[0] == 10
    assert cut([0, 10, 20], {0: 1000, 10: 900, 20: 800}, 700)[0] == 20  # refused later as too long
