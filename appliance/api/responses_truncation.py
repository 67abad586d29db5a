"""The Responses API's `truncation: auto`: a conversation that no longer fits the model's context
is asked without its oldest turns.

A cut falls where a user message starts a turn, so a function call and its output are kept or
dropped together; system and developer messages before the cut are kept (they are instructions,
as `instructions` is, which is never dropped), and the latest turn always stays. The prompt must
leave the answer `max_output_tokens`, or without it a quarter of the context (the server's
`max_tokens` cap where that is less).

Each stored response keeps its cut, and the next response of its conversation cuts there again
while its prompt fits, so its prompt starts as the one before did and the prefix cache restores
it. When a cut must move, it moves to the first turn that leaves a quarter of the prompt's room
free, so that the turns after it fit without moving it again (a cut that moved every turn would
make every turn read its whole prompt again)."""

from __future__ import annotations

from typing import Awaitable, Callable

from ..config import Config
from ..engine.runner import ModelRunner
from .schemas import ChatMessage

_KEPT_ROLES = ("system", "developer")
_GROWTH_ROOM = 0.25  # a moved cut leaves this share of the prompt's room for the turns after it


def kept(conversation: list[ChatMessage], cut: int) -> list[ChatMessage]:
    """The messages a prompt cut at `cut` holds: the instructions before it, and all from it."""
    return [m for m in conversation[:cut] if m.role in _KEPT_ROLES] + conversation[cut:]


def turn_starts(conversation: list[ChatMessage], floor: int) -> list[int]:
    """The places a cut may fall, from `floor` on: where each user message starts a turn (the
    first one, or `floor` itself where no user message follows it)."""
    starts = [i for i, m in enumerate(conversation) if m.role == "user" and i >= floor]
    return starts if starts and starts[0] == floor else [floor, *starts]


def prompt_room(config: Config, runner: ModelRunner, max_output_tokens: int | None) -> int:
    """The most prompt tokens that leave the answer its room."""
    limits = config.server.limits
    answer = max_output_tokens
    if answer is None:
        answer = runner.n_ctx // 4 if limits.max_tokens is None else min(runner.n_ctx // 4, limits.max_tokens)
    room = runner.n_ctx - max(answer, 1)
    return room if limits.max_prompt_tokens is None else min(room, limits.max_prompt_tokens)


async def choose_cut(starts: list[int], size: Callable[[int], Awaitable[int]], room: int) -> int:
    """Where to cut (`size(cut)`: the prompt's tokens cut there): the first place while its prompt
    fits `room`; else the first later one that leaves a quarter of `room` free, or failing that
    the first that fits; else the last (its prompt is then refused as too long, as without
    truncation)."""
    if await size(starts[0]) <= room:
        return starts[0]
    for limit in (int(room * (1 - _GROWTH_ROOM)), room):
        lo, hi = 1, len(starts)  # the sizes fall as the cut moves on: the first that fits, by halves
        while lo < hi:
            mid = (lo + hi) // 2
            if await size(starts[mid]) <= limit:
                hi = mid
            else:
                lo = mid + 1
        if lo < len(starts):
            return starts[lo]
    return starts[-1]
