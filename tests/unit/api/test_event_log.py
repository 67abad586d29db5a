"""A streamed background response's event log: read from any sequence number, followed live
until it closes; an event out of order is refused, and nothing is logged once a cancel closed it."""

from __future__ import annotations

import asyncio
import json

import pytest

from appliance.api.event_log import EventLog


def event(n: int, kind: str = "response.output_text.delta") -> dict:
    return {"type": kind, "sequence_number": n}


def parsed(framed: bytes) -> dict:
    name, data, blank, end = framed.decode().split("\n")
    assert name.startswith("event: ") and data.startswith("data: ") and blank == end == ""
    body = json.loads(data[len("data: "):])
    assert body["type"] == name[len("event: "):]
    return body


def test_a_reader_gets_the_events_after_its_number_then_each_as_it_comes():
    async def run() -> tuple[list[int], list[int]]:
        log = EventLog()
        log.append(event(0, "response.created"))
        log.append(event(1))

        async def read(after: int) -> list[int]:
            return [parsed(e)["sequence_number"] async for e in log.follow(after)]

        early, late = asyncio.ensure_future(read(-1)), asyncio.ensure_future(read(1))
        await asyncio.sleep(0)
        for n in range(2, 5):
            log.append(event(n))
            await asyncio.sleep(0)
        log.close()
        return await early, await late

    early, late = asyncio.run(run())
    assert early == [0, 1, 2, 3, 4] and late == [2, 3, 4]


def test_a_closed_log_reads_whole_and_takes_nothing_more():
    async def run() -> list[bytes]:
        log = EventLog([json.dumps(event(0)).encode()], done=True)
        log.append(event(1))  # a generation's end after a cancel
        return [e async for e in log.follow(-1)] + [e async for e in log.follow(5)]

    assert [parsed(e)["sequence_number"] for e in asyncio.run(run())] == [0]


def test_an_event_out_of_order_is_refused():
    log = EventLog()
    with pytest.raises(ValueError):
        log.append(event(3))
