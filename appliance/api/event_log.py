"""A streamed background response's events, kept so that they can be read again: by the POST
that made it, and by any client that comes back with GET /v1/responses/{id}?stream=true
(&starting_after=N) while it runs or after it has finished (the Responses API's resumable
streams). An event's place in the log is its `sequence_number`."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator, Iterable

import msgspec

from .schemas import encoder


class _Typed(msgspec.Struct):
    type: str


_typed = msgspec.json.Decoder(_Typed)


def _framed(kind: str, event: bytes) -> bytes:
    """One event's JSON as a server-sent event named by its type."""
    return b"event: " + kind.encode() + b"\ndata: " + event + b"\n\n"


class EventLog:
    def __init__(self, events: Iterable[bytes] = (), done: bool = False):
        self.events: list[bytes] = list(events)  # each event's JSON, in sequence order (what is stored)
        # each one's type, which names it in the stream (a stored event's is read once, here)
        self._types = [_typed.decode(e).type for e in self.events]
        self.done = done
        self._wake = asyncio.Event()

    def append(self, event: dict[str, Any]) -> None:
        if self.done:  # closed by a cancel: the generation's end is not an event of the response's
            return
        if event["sequence_number"] != len(self.events):  # a writer's every event comes here, in order
            raise ValueError(f"event {event['sequence_number']} logged as event {len(self.events)}")
        self.events.append(encoder.encode(event))
        self._types.append(event["type"])
        self._ring()

    def close(self) -> None:
        """No more events: the response has reached its end (or was cancelled)."""
        self.done = True
        self._ring()

    def _ring(self) -> None:
        self._wake.set()
        self._wake = asyncio.Event()

    async def follow(self, after: int) -> AsyncIterator[bytes]:
        """The events after sequence number `after`, framed, then each one as it comes, until the
        log closes."""
        at = max(after + 1, 0)
        while True:
            wake = self._wake  # taken before looking, so an event logged meanwhile still wakes us
            while at < len(self.events):
                yield _framed(self._types[at], self.events[at])
                at += 1
            if self.done:
                return
            await wake.wait()
