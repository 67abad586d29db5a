"""Work that yields to every other request: a batch's requests (the Batch API) are made with
`background` set in their context. The runner admits them to a sequence slot only after every
other waiting request, and never into its last free slot (where it has more than one), so an
interactive request that comes while a batch runs finds a slot at once. Where every slot is
taken all the same (one slot, or interactive requests in the others), a background sequence is
parked: its KV state is copied to host memory and its slot given to the interactive request; it
resumes from that state, exactly where it stopped, when a slot is free again
(server.batches.preempt). Background work never takes an interactive request's place in the
queue (max_queue) either."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Callable, Sequence, TypeVar

background: ContextVar[bool] = ContextVar("eie_background_priority", default=False)

S = TypeVar("S")


def admission_order(waiting: Sequence[S], parked: Sequence[S], is_background: Callable[[S], bool]) -> list[S]:
    """The sequences in the order they are offered a slot: every interactive one first, then the
    parked ones (parked first, resumed first), then the background ones that never ran; each
    group in its arrival order."""
    return ([s for s in waiting if not is_background(s)] + list(parked)
            + [s for s in waiting if is_background(s)])


def may_take_slot(is_background: bool, free_slots: int, n_slots: int) -> bool:
    """Whether a sequence may take a free slot: background work leaves the last one free."""
    return free_slots > (1 if is_background and n_slots > 1 else 0)


def queue_room(is_background: bool, foreground: int, background_count: int, n_slots: int, max_queue: int,
               preempt: bool) -> int:
    """How many more sequences may be queued: an interactive request counts only interactive
    sequences where background ones yield their slots (`preempt`), all of them otherwise."""
    taken = foreground if preempt and not is_background else foreground + background_count
    return n_slots + max_queue - taken


def victims(starved: int, free_slots: int, candidates: Sequence[S], size: Callable[[S], int]) -> list[S]:
    """The background sequences to park so that `starved` interactive sequences find a slot:
    as few as that takes, the smallest states first (the least to copy)."""
    need = starved - free_slots
    if need <= 0:
        return []
    return sorted(candidates, key=size)[:need]
