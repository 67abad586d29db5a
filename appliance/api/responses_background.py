"""Background responses (the Responses API's `background: true`, with `store`).

The POST answers at once with the response `queued`; a task of its own makes the answer through
the same code as a foreground response, with a DetachedRequest in place of the client, and the
store holds each state as it comes: `in_progress`, then `completed` or `incomplete` (stored by
the answer's writer), `failed` (with the error a foreground request would have got) or
`cancelled` (POST /v1/responses/{id}/cancel, which stops the generation as a client going away
does). The work counts as a request in flight, so a drain waits for it and ends it with the
others once its grace is over; one the process never finished reads as failed after a restart
(response_store.py).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from msgspec.structs import replace

from .errors import ApiError
from .generation import ENGINE_ERRORS, engine_error
from .http import DetachedRequest, Request
from .responses_output import ResponseEvents
from .responses_schemas import Response, ResponseError

log = logging.getLogger("eie.responses")

Answer = Callable[[Request, ResponseEvents], Awaitable[None]]  # makes the answer through the writer


@dataclass
class _Job:
    request: DetachedRequest
    writer: ResponseEvents
    keep: Callable[[Response], None]  # stores a state of the response
    rename: Callable[[ApiError], ApiError]  # an error as the Responses API names its fields
    task: asyncio.Future[None] | None = field(default=None)


class BackgroundResponses:
    def __init__(self, in_flight: Callable[[], AbstractContextManager[None]]):
        self.in_flight = in_flight  # counts the work as a request in flight (the app's drain waits for it)
        self._jobs: dict[str, _Job] = {}

    def start(self, request: Request, queued: Response, logprobs: bool, keep: Callable[[Response], None],
              answer: Answer, rename: Callable[[ApiError], ApiError]) -> None:
        """Store `queued` and make its answer in the background."""
        keep(queued)
        writer = ResponseEvents(replace(queued, status="in_progress"), logprobs, keep)
        job = _Job(DetachedRequest(request), writer, keep, rename)
        self._jobs[queued.id] = job
        job.task = asyncio.ensure_future(self._run(job, answer))

    async def _run(self, job: _Job, answer: Answer) -> None:
        base = job.writer.base
        try:
            with self.in_flight():
                job.keep(base)
                failure: ApiError | None = None
                try:
                    await answer(job.request, job.writer)
                except ENGINE_ERRORS as e:
                    failure = job.rename(engine_error(e))
                except ApiError as e:
                    failure = job.rename(e)
                except Exception:
                    log.exception("background response %s failed", base.id)
                    failure = ApiError(500, "internal server error", type="server_error")
                output = list(job.writer.items)
                if job.request.cancelled:
                    job.keep(replace(job.writer.result or base, status="cancelled", output=output))
                elif failure is not None:
                    job.keep(replace(base, status="failed", output=output,
                                     error=ResponseError(failure.code or failure.type, failure.message)))
                elif job.writer.result is None:  # the answer ended without finishing (cannot happen)
                    job.keep(replace(base, status="failed", output=output,
                                     error=ResponseError("server_error", "the answer ended without finishing")))
        finally:
            del self._jobs[base.id]

    async def cancel(self, response_id: str) -> None:
        """Stop the response's generation, if it is still running, and wait until its state is stored."""
        job = self._jobs.get(response_id)
        if job is None or job.task is None:
            return
        job.request.cancel()
        await asyncio.wait([job.task], timeout=30)
