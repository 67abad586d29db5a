"""Background responses (the Responses API's `background: true`, with `store`).

The POST answers at once with the response `queued`; a task of its own makes the answer through
the same code as a foreground response, with a DetachedRequest in place of the client, and the
store holds each state as it comes: `in_progress`, then `completed` or `incomplete` (stored by
the answer's writer), `failed` (with the error a foreground request would have got) or
`cancelled` (POST /v1/responses/{id}/cancel, which stops the generation as a client going away
does). The work counts as a request in flight, so a drain waits for it and ends it with the
others once its grace is over, and against its key's concurrent requests until it ends; one the
process never finished reads as failed after a restart (response_store.py).

One asked with `stream` keeps its events in a log (event_log.py): the POST streams them, and a
client that lost that stream reads them again from any point, while the response runs or after
(they are stored with its final state). A cancelled response's stream ends with no final event.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Awaitable, Callable

from msgspec.structs import replace

from ..observability import context
from .errors import ApiError
from .event_log import EventLog
from .generation import ENGINE_ERRORS, engine_error
from .http import DetachedRequest, Request
from .responses_output import ResponseEvents
from .responses_schemas import Response, ResponseError

log = logging.getLogger("eie.responses")

Answer = Callable[[Request, ResponseEvents], Awaitable[None]]  # makes the answer through the writer
_RETRY_S = (0.5, 5.0)  # the first wait before a refused answer goes again, and the longest


def _asks_retry(err: ApiError) -> bool:
    """A refusal that says to ask again (429 or 503 with retry-after: a full queue, a model loading)."""
    return err.status in (429, 503) and any(name == b"retry-after" for name, _ in err.headers or [])
Keep = Callable[..., None]  # keep(response, events=None): stores a state of the response


@dataclass
class _Job:
    request: DetachedRequest
    writer: ResponseEvents
    keep: Keep
    rename: Callable[[ApiError], ApiError]  # an error as the Responses API names its fields
    holder: str | None  # whose concurrent requests it counts against
    log: EventLog | None  # its stream's events (asked with `stream`)
    task: asyncio.Future[None] | None = field(default=None)


_STATUS = {"completed": 200, "incomplete": 200, "cancelled": 499}  # a failed one: its error's status


class BackgroundResponses:
    def __init__(self, in_flight: Callable[[str | None], AbstractContextManager[None]],
                 account: Callable[[context.RequestInfo, bytes | None], None] | None = None):
        # counts the work as a request in flight (the app's drain waits for it) of its key's
        self.in_flight = in_flight
        # logs and audits the work once it ends, as a request of its own (its POST answered
        # `queued` with no tokens): its models, tokens and outcome
        self.account = account
        self._jobs: dict[str, _Job] = {}

    def start(self, request: Request, queued: Response, logprobs: bool, keep: Keep, answer: Answer,
              rename: Callable[[ApiError], ApiError], stream: bool = False) -> EventLog | None:
        """Store `queued` and make its answer in the background; with `stream`, the log its
        events go to (its first two, `response.created` and `response.queued`, are there)."""
        keep(queued)
        events = EventLog() if stream else None
        writer = ResponseEvents(replace(queued, status="in_progress"), logprobs, keep,
                                events.append if events is not None else None)
        if events is not None:
            writer.queued(queued)
        holder, request.limit_holder = request.limit_holder, None  # the work holds the POST's count on
        job = _Job(DetachedRequest(request), writer, keep, rename, holder, events)
        self._jobs[queued.id] = job
        job.task = asyncio.ensure_future(self._run(job, answer))
        return events

    def log(self, response_id: str) -> EventLog | None:
        """The events of a streamed background response still running."""
        job = self._jobs.get(response_id)
        return job.log if job is not None else None

    async def _run(self, job: _Job, answer: Answer) -> None:
        writer = job.writer
        base = writer.base
        post = context.info()
        info = context.RequestInfo(base.id, "POST", "/v1/responses", key_id=post.key_id if post else None,
                                   background=True)
        if post is not None and post.content is not None:  # (audit.include_content: its answer too)
            info.content = {}
        token = context.current.set(info)  # (this task's own context: the taps count its tokens here)
        info.status = 500
        try:
            with self.in_flight(job.holder):
                job.keep(base)
                wait = _RETRY_S[0]
                while True:
                    failure = await self._attempt(job, answer)
                    if failure is None or writer.started or not _asks_retry(failure):
                        break
                    # a full queue (or a model loading): it waits its turn, as a batch's request does
                    if await job.request.cancelled_within(wait):
                        break
                    wait = min(wait * 2, _RETRY_S[1])
                failure = failure or writer.error  # (a streamed answer says its failure in its events)
                output = list(writer.items)
                final = writer.result
                if job.request.cancelled:
                    final = replace(final or base, status="cancelled", output=output)
                elif final is None:
                    failure = failure or ApiError(500, "the answer ended without finishing", type="server_error")
                    if writer.error is None and job.log is not None:
                        writer.failed(failure)
                    final = replace(base, status="failed", output=output,
                                    error=ResponseError(failure.code or failure.type, failure.message))
                if job.log is not None:
                    job.keep(final, events=job.log.events)
                elif final is not writer.result:  # (the writer stored its result)
                    job.keep(final)
                info.status = _STATUS.get(final.status) or (failure.status if failure is not None else 500)
                if final.status == "failed":
                    info.error_code = final.error.code if final.error is not None else "failed"
        finally:
            if job.log is not None:
                job.log.close()
            del self._jobs[base.id]
            info.release_holds()
            if self.account is not None:  # (its log line's request_id is the response's id)
                self.account(info, job.request.raw_body)
            context.current.reset(token)

    @staticmethod
    async def _attempt(job: _Job, answer: Answer) -> ApiError | None:
        """Make the answer; the error that stopped it, if one did."""
        try:
            await answer(job.request, job.writer)
        except ENGINE_ERRORS as e:
            return job.rename(engine_error(e))
        except ApiError as e:
            return job.rename(e)
        except Exception:
            log.exception("background response %s failed", job.writer.base.id)
            return ApiError(500, "internal server error", type="server_error")
        return None

    async def cancel(self, response_id: str) -> None:
        """Stop the response's generation, if it is still running, and wait until its state is stored."""
        job = self._jobs.get(response_id)
        if job is None or job.task is None:
            return
        if job.log is not None:
            job.log.close()  # its stream ends here
        job.request.cancel()
        await asyncio.wait([job.task], timeout=30)
