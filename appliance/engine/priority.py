"""Work that yields to every other request: a batch's requests (the Batch API) are made with
`background` set in their context, and the runner admits them to a sequence slot only after
every other waiting request, and never into its last free slot (where it has more than one), so
an interactive request that comes while a batch runs finds a slot at once."""

from __future__ import annotations

from contextvars import ContextVar

background: ContextVar[bool] = ContextVar("eie_background_priority", default=False)


def admission_order(waiting: list, is_background) -> list:
    """The waiting sequences in the order they are offered a slot: every foreground one first,
    each group in its arrival order."""
    return sorted(waiting, key=is_background)


def may_take_slot(is_background: bool, free_slots: int, n_slots: int) -> bool:
    """Whether a sequence may take a free slot: background work leaves the last one free."""
    return free_slots > (1 if is_background and n_slots > 1 else 0)
