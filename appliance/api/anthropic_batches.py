"""Anthropic's Message Batches API: POST /v1/messages/batches (`requests`: [{custom_id, params}]),
GET /v1/messages/batches, GET/DELETE /v1/messages/batches/{id}, POST .../{id}/cancel, GET
.../{id}/results. A message batch is a batch of the Batch API's (batch_runner.py: the same
background priority, retries, restarts) whose requests go to /v1/messages; this module keeps its
requests as an input file and shows it, and its results, as Anthropic's SDKs read them."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from datetime import datetime, timezone
from typing import Any, Iterator

import msgspec

from ..config import Config
from ..observability import context
from . import batch_input
from .batch_runner import BatchRunner
from .batch_store import Batch, BatchStore, new_batch
from .errors import ApiError, bad_request, decoded
from .file_store import FileStore, FileTooLarge
from .http import Request
from .item_pages import id_page
from .json_store import MissingRecord
from .schemas import encoder

ENDPOINT = "/v1/messages"
MAX_REQUESTS = 100_000
_CUSTOM_ID = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
_ENDED = ("completed", "cancelled", "expired", "failed")
_PIECE = 1 << 16  # results are sent in pieces of about this many bytes


class BatchRequest(msgspec.Struct, frozen=True):
    custom_id: str
    params: dict[str, Any]


class MessageBatchCreate(msgspec.Struct, frozen=True):
    requests: list[BatchRequest]


class MessageBatchCounts(msgspec.Struct, frozen=True):
    processing: int
    succeeded: int
    errored: int
    canceled: int
    expired: int


class MessageBatch(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    type: str = "message_batch"
    processing_status: str  # in_progress | canceling | ended
    request_counts: MessageBatchCounts
    ended_at: str | None
    created_at: str
    expires_at: str
    archived_at: str | None = None
    cancel_initiated_at: str | None
    results_url: str | None


class DeletedMessageBatch(msgspec.Struct, frozen=True):
    id: str
    type: str = "message_batch_deleted"


class MessageBatchList(msgspec.Struct, frozen=True):
    data: list[MessageBatch]
    has_more: bool
    first_id: str | None
    last_id: str | None


_create = msgspec.json.Decoder(MessageBatchCreate)


def _time(ts: int | None) -> str | None:
    """An RFC 3339 time, as Anthropic's API writes them."""
    return datetime.fromtimestamp(ts, timezone.utc).isoformat().replace("+00:00", "Z") if ts is not None else None


def shown(batch: Batch) -> MessageBatch:
    counts = batch.request_counts
    left = counts.total - counts.completed - counts.failed  # not run (yet)
    ended = batch.status in _ENDED
    return MessageBatch(
        id=batch.id,
        processing_status="ended" if ended else "canceling" if batch.status == "cancelling" else "in_progress",
        request_counts=MessageBatchCounts(
            processing=0 if ended else left, succeeded=counts.completed, errored=counts.failed,
            canceled=left if batch.status == "cancelled" else 0,
            expired=left if batch.status in ("expired", "failed") else 0),
        ended_at=_time(batch.completed_at or batch.cancelled_at or batch.expired_at or batch.failed_at),
        created_at=_time(batch.created_at), expires_at=_time(batch.expires_at),
        cancel_initiated_at=_time(batch.cancelling_at),
        results_url=f"/v1/messages/batches/{batch.id}/results" if ended else None)


class MessageBatchRoutes:
    def __init__(self, config: Config, store: BatchStore, files: FileStore, runner: BatchRunner):
        self.config = config
        self.store = store
        self.files = files
        self.runner = runner

    async def create(self, request: Request) -> None:
        raw = await request.body(self.config.server.files.max_file_mb << 20)
        who = context.key_id()
        batch_id = f"msgbatch_{uuid.uuid4().hex}"
        # up to 100,000 requests: read, checked and written off the event loop, whose streams go on
        file, count = await asyncio.to_thread(self._requests_file, raw, batch_id, who)
        batch = new_batch(batch_id, ENDPOINT, file.id, count, 24 * 3600)
        self.store.put(batch, who, time.time_ns())
        self.runner.start(batch)
        await request.json(200, shown(batch))

    def _requests_file(self, raw: bytes, batch_id: str, who: str | None) -> tuple[Any, int]:
        """The batch's requests checked (a 400 naming the first that cannot run) and stored as a
        batch input file; and how many there are."""
        body: MessageBatchCreate = decoded(_create, raw)
        if not 1 <= len(body.requests) <= MAX_REQUESTS:
            raise bad_request(f"a message batch has 1 to {MAX_REQUESTS} requests", param="requests")
        seen: set[str] = set()
        for i, r in enumerate(body.requests):
            if not _CUSTOM_ID.match(r.custom_id):
                raise bad_request("custom_id must be 1 to 64 letters, digits, _ or -",
                                  param=f"requests[{i}].custom_id")
            if r.custom_id in seen:
                raise bad_request(f"custom_id {r.custom_id!r} is on an earlier request",
                                  param=f"requests[{i}].custom_id")
            if r.params.get("stream"):
                raise bad_request("a batch's messages are answered whole: leave stream out",
                                  param=f"requests[{i}].params.stream")
            seen.add(r.custom_id)
        scratch = self.files.scratch()
        with open(scratch, "wb") as f:
            for r in body.requests:
                f.write(encoder.encode({"custom_id": r.custom_id, "method": "POST", "url": ENDPOINT,
                                        "body": r.params}) + b"\n")
        try:
            file = self.files.add(scratch, f"{batch_id}_requests.jsonl", "batch", who)
        except FileTooLarge as e:
            raise ApiError(413, str(e), code="files_full") from None
        finally:
            scratch.unlink(missing_ok=True)
        return file, len(body.requests)

    def _batch(self, request: Request) -> Batch:
        batch_id = request.path_params["batch_id"]
        try:
            if not batch_id.startswith("msgbatch_"):
                raise MissingRecord(batch_id)
            return self.store.get(batch_id, context.key_id())
        except MissingRecord as e:
            raise ApiError(404, f"message batch {e.record_id!r} is {e.why}") from None

    async def retrieve(self, request: Request) -> None:
        await request.json(200, shown(self._batch(request)))

    async def listed(self, request: Request) -> None:
        """Newest first, `limit` (1-1000, default 20) at a time, after `after_id` or before `before_id`."""
        batches = [b for b in reversed(self.store.listed(context.key_id())) if b.endpoint == ENDPOINT]
        chosen, more = id_page(batches, [b.id for b in batches], request, "message batch")
        page = [shown(b) for b in chosen]
        await request.json(200, MessageBatchList(page, more, page[0].id if page else None,
                                                 page[-1].id if page else None))

    async def cancel(self, request: Request) -> None:
        await request.json(200, shown(self.runner.cancel(self._batch(request))))

    async def delete(self, request: Request) -> None:
        """An ended batch goes, with its requests and results."""
        batch = self._batch(request)
        if batch.status not in _ENDED:
            raise bad_request("a message batch that is still processing cannot be deleted: cancel it first")
        owner = self.store.owner_of(batch.id)
        for file_id in (batch.input_file_id, batch.output_file_id, batch.error_file_id):
            if file_id is not None:
                try:
                    self.files.delete(file_id, owner)
                except MissingRecord:
                    pass
        self.store.delete(batch.id)
        await request.json(200, DeletedMessageBatch(batch.id))

    async def results(self, request: Request) -> None:
        """Each request's result, as JSON lines: succeeded (its message), errored (its error),
        canceled or expired."""
        batch = self._batch(request)
        if batch.status not in _ENDED:
            raise bad_request("the message batch is still processing: its results come when it has ended")
        owner = self.store.owner_of(batch.id)
        await request.send({"type": "http.response.start", "status": 200,
                            "headers": [(b"content-type", b"application/binary")]})
        piece: list[bytes] = []
        size = 0
        for line in self._result_lines(batch, owner):  # sent in pieces: a file's lines are read as they go
            piece.append(line)
            size += len(line)
            if size >= _PIECE:
                await request.send({"type": "http.response.body", "body": b"".join(piece), "more_body": True})
                piece, size = [], 0
        await request.send({"type": "http.response.body", "body": b"".join(piece)})

    def _result_lines(self, batch: Batch, owner: str | None) -> Iterator[bytes]:
        """The result lines of the requests that ran (the output file, then the error file),
        then those of the ones that did not (canceled or expired)."""
        answered: set[str] = set()
        for file_id in (batch.output_file_id, batch.error_file_id):
            if file_id is None:
                continue
            try:
                f = open(self.files.path(self.files.get(file_id, owner).id), "rb")
            except (MissingRecord, OSError):
                continue
            with f:
                for line in f:
                    record = msgspec.json.decode(line)
                    answered.add(record["custom_id"])
                    yield encoder.encode({"custom_id": record["custom_id"], "result": _result(record)}) + b"\n"
        unrun = "expired" if batch.status in ("expired", "failed") else "canceled"
        try:
            for line in batch_input.requests(self.files.path(batch.input_file_id), ENDPOINT):
                if line.custom_id not in answered:
                    yield encoder.encode({"custom_id": line.custom_id, "result": {"type": unrun}}) + b"\n"
        except OSError:
            pass


def _result(record: dict[str, Any]) -> dict[str, Any]:
    """A batch result line as Anthropic's result: its message, or its error."""
    response = record.get("response")
    if response is None:  # (not run: expired)
        return {"type": "expired"}
    if 200 <= response["status_code"] < 300:
        return {"type": "succeeded", "message": response["body"]}
    error = response["body"] if isinstance(response["body"], dict) else {
        "type": "error", "error": {"type": "api_error", "message": str(response["body"])}}
    return {"type": "errored", "error": {**error, "request_id": response.get("request_id")}}
