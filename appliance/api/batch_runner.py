"""A batch's requests run in the background: each line of its input file goes through the
server's own route for the batch's endpoint (as its key, without its per-key limits), a few at a
time (server.batches.concurrent_requests), at background priority (engine/priority.py: behind
every other request, never in a model's last free slot, parked for an interactive request that
finds every slot taken). Its input file is read a line at a time (batch_input.py). A request
refused because a queue is full or a model is loading is tried again later; its answer,
whatever its status, is the line's result. A stop (SIGTERM) leaves the batch in progress: the requests it cut short run again after
the restart, the finished ones do not."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable

import msgspec

from ..engine import priority
from . import batch_input
from .batch_input import Line
from .batch_store import Batch, BatchErrors, BatchStore, LineError, RequestCounts
from .file_store import FileStore, FileTooLarge

log = logging.getLogger("eie.batches")

@dataclass(frozen=True)
class InternalAnswer:
    status: int
    body: bytes
    request_id: str
    retry_after: bool  # the server asked to be asked again (a full queue, a model loading)


# call(method, path, body, key id, cancel): a request made inside the server
Call = Callable[[str, str, bytes, "str | None", asyncio.Event], Awaitable[InternalAnswer]]

_RETRY_S = (0.5, 5.0)  # the first wait before a request goes again, and the longest


def now() -> int:
    return int(time.time())


@dataclass
class _Running:
    task: asyncio.Task | None = None
    cancel: asyncio.Event = field(default_factory=asyncio.Event)  # the batch is cancelled: in-flight requests end
    stop: asyncio.Event = field(default_factory=asyncio.Event)  # the server stops: they end, and run again later


class BatchRunner:
    def __init__(self, store: BatchStore, files: FileStore, call: Call, concurrency: Callable[[], int]):
        self.store = store
        self.files = files
        self.call = call
        self.concurrency = concurrency
        self._running: dict[str, _Running] = {}

    @property
    def running(self) -> int:
        return len(self._running)

    def resume(self) -> None:
        """Start the batches a previous run left unfinished (at start-up, on the event loop)."""
        for batch in self.store.unfinished():
            self.start(batch)

    def start(self, batch: Batch) -> None:
        running = self._running[batch.id] = _Running()
        running.task = asyncio.ensure_future(self._run(batch.id, running))

    def cancel(self, batch: Batch) -> Batch:
        """A batch in progress becomes `cancelling`: its running requests end without results, and
        it ends `cancelled` with those it has. One that has ended comes back as it is."""
        if batch.status != "in_progress":
            return batch
        batch = self._update(batch.id, status="cancelling", cancelling_at=now())
        running = self._running.get(batch.id)
        if running is not None:
            running.cancel.set()
        else:  # (between its requests' end and its own: it finishes as cancelled)
            self.start(batch)
        return batch

    async def stop(self) -> None:
        """End the running requests without results (they run again after a restart)."""
        for running in self._running.values():
            running.stop.set()
        tasks = [r.task for r in self._running.values() if r.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=10)

    def _update(self, batch_id: str, **changes: Any) -> Batch:
        owner = self.store.owner_of(batch_id)
        return self.store.put(msgspec.structs.replace(self.store.get(batch_id, owner), **changes), owner)

    async def _run(self, batch_id: str, running: _Running) -> None:
        try:
            await self._work(batch_id, running)
        except Exception as e:
            log.exception("batch %s failed", batch_id)
            why = f"the batch could not write its state: {e.strerror or e}" if isinstance(e, OSError) \
                else "the batch stopped on an internal error"
            try:
                self._update(batch_id, status="failed", failed_at=now(), errors=BatchErrors(
                    [LineError("server_error", why)]))
            except OSError as e2:  # failed in memory all the same (store.put keeps it there first)
                log.error("batch %s: its failed state is not on disk: %s", batch_id, e2)
        finally:
            self._running.pop(batch_id, None)

    async def _work(self, batch_id: str, running: _Running) -> None:
        owner = self.store.owner_of(batch_id)
        batch = self.store.get(batch_id, owner)
        if batch.status in ("in_progress", "validating"):
            done, completed, failed = self.store.finished_ids(batch_id)
            batch = self._update(batch_id, status="in_progress", in_progress_at=batch.in_progress_at or now(),
                                 request_counts=RequestCounts(batch.request_counts.total, completed, failed))
            # (its file was checked when the batch was made, and cannot change)
            with contextlib.closing(batch_input.requests(self.files.path(batch.input_file_id), batch.endpoint)) as all_:
                await self._lines(batch, (line for line in all_ if line.custom_id not in done), owner, running)
            if running.stop.is_set():
                return  # in progress still: the restart goes on with it
            batch = self.store.get(batch_id, owner)
            if batch.status == "in_progress":
                batch = self._update(batch_id, status="finalizing", finalizing_at=now())
        if running.stop.is_set():
            return
        self._finish(batch_id, owner)

    async def _lines(self, batch: Batch, lines: Iterable[Line], owner: str | None, running: _Running) -> None:
        slots = asyncio.Semaphore(max(1, self.concurrency()))
        tasks: set[asyncio.Task] = set()
        ended = asyncio.Event()  # cancelled, stopping or expired: no new request starts

        async def watch() -> None:
            waits = [asyncio.ensure_future(running.cancel.wait()), asyncio.ensure_future(running.stop.wait())]
            try:
                await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                ended.set()
            finally:
                for w in waits:
                    w.cancel()

        watcher = asyncio.ensure_future(watch())
        try:
            for line in lines:
                await slots.acquire()
                if ended.is_set() or (batch.expires_at is not None and now() >= batch.expires_at):
                    slots.release()
                    break
                task = asyncio.ensure_future(self._line(batch, line, owner, running, ended))
                tasks.add(task)
                task.add_done_callback(lambda t: (tasks.discard(t), slots.release()))
            if tasks:
                await asyncio.wait(set(tasks))
        finally:
            watcher.cancel()
        if not ended.is_set() and batch.expires_at is not None and now() >= batch.expires_at:
            self._expire(batch, owner)

    async def _line(self, batch: Batch, line: Line, owner: str | None, running: _Running,
                    ended: asyncio.Event) -> None:
        priority.background.set(True)  # (this task's context: the requests it makes yield to others)
        wait = _RETRY_S[0]
        while True:
            answer = await self.call(line.method, line.url, line.body, owner, ended)
            if ended.is_set():
                return  # cut short: cancelled (no result) or stopping (it runs again after the restart)
            if not (answer.status in (429, 503) and answer.retry_after):
                break
            try:
                await asyncio.wait_for(ended.wait(), wait)
                return
            except asyncio.TimeoutError:
                wait = min(wait * 2, _RETRY_S[1])
        try:
            body: Any = msgspec.json.decode(answer.body)
        except msgspec.DecodeError:
            body = answer.body.decode("utf-8", "replace")
        failed = not 200 <= answer.status < 300
        self.store.append(batch.id, failed, {
            "id": f"batch_req_{uuid.uuid4().hex}", "custom_id": line.custom_id,
            "response": {"status_code": answer.status, "request_id": answer.request_id, "body": body},
            "error": None})
        counts = self.store.get(batch.id, owner).request_counts
        self._update(batch.id, request_counts=RequestCounts(counts.total, counts.completed + (not failed),
                                                            counts.failed + failed))

    def _expire(self, batch: Batch, owner: str | None) -> None:
        """The completion window has passed: the requests not run are failed as expired."""
        done, completed, failed = self.store.finished_ids(batch.id)
        expired = 0
        for line in batch_input.requests(self.files.path(batch.input_file_id), batch.endpoint):
            if line.custom_id not in done:
                self.store.append(batch.id, True, {
                    "id": f"batch_req_{uuid.uuid4().hex}", "custom_id": line.custom_id, "response": None,
                    "error": {"code": "batch_expired", "message": "the batch's completion window passed before "
                              "this request ran"}})
                expired += 1
        # an OpenAI batch counts them as failed, as its error file has them (total = completed +
        # failed); a message batch shows the requests it did not run as expired (anthropic_batches)
        counts = RequestCounts(batch.request_counts.total, completed, failed + expired) \
            if not batch.id.startswith("msgbatch_") else batch.request_counts
        self._update(batch.id, status="expired", expired_at=now(), request_counts=counts)

    def _finish(self, batch_id: str, owner: str | None) -> None:
        """The results become files (batch_output) and the batch ends: completed, or cancelled
        with the results it has, or expired."""
        batch = self.store.get(batch_id, owner)
        for failed, key in ((False, "output_file_id"), (True, "error_file_id")):
            path = self.store.results(batch_id, failed)
            if getattr(batch, key) is not None or not path.exists() or not path.stat().st_size:
                continue  # (made a file already, before a stop)
            scratch = self.files.scratch()
            path.replace(scratch)
            try:
                file = self.files.add(scratch, f"{batch_id}_{'error' if failed else 'output'}.jsonl", "batch_output",
                                      owner)
            except FileTooLarge as e:
                self._update(batch_id, status="failed", failed_at=now(),
                             errors=BatchErrors([LineError("files_full", str(e))]))
                return
            batch = self._update(batch_id, **{key: file.id})
        end = {"cancelling": ("cancelled", "cancelled_at"), "expired": ("expired", "expired_at")}.get(
            batch.status, ("completed", "completed_at"))
        self._update(batch_id, status=end[0], **{end[1]: getattr(batch, end[1]) or now()})
