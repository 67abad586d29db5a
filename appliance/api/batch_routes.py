"""OpenAI's Batch API: POST /v1/batches (a file of requests to one endpoint, run in the
background: batch_runner.py), GET /v1/batches, GET /v1/batches/{batch_id}, POST
/v1/batches/{batch_id}/cancel. The results are files (GET /v1/files/{id}/content)."""

from __future__ import annotations

import asyncio
import time
import uuid

import msgspec

from ..config import Config
from ..observability import context
from . import batch_input
from .batch_runner import BatchRunner, Call
from .batch_store import ENDPOINTS, Batch, BatchCreate, BatchErrors, BatchStore, RequestCounts, new_batch
from .errors import bad_request, decoded
from .file_store import FileStore
from .http import Request
from .json_store import MissingRecord, not_found
from .item_pages import item_page

_create = msgspec.json.Decoder(BatchCreate)
WINDOW_S = {"24h": 24 * 3600}


class BatchRoutes:
    def __init__(self, config: Config, store: BatchStore, files: FileStore, call: Call):
        self.config = config
        self.store = store
        self.files = files
        self.runner = BatchRunner(store, files, call, lambda: self.config.server.batches.concurrent_requests)

    async def create(self, request: Request) -> None:
        body: BatchCreate = decoded(_create, await request.body(self.config.server.limits.max_body_bytes))
        if body.endpoint not in ENDPOINTS:
            raise bad_request(f"endpoint must be one of {', '.join(ENDPOINTS)}", param="endpoint")
        if body.completion_window not in WINDOW_S:
            raise bad_request("completion_window must be 24h", param="completion_window")
        who = context.key_id()
        try:
            file = self.files.get(body.input_file_id, who)
        except MissingRecord as e:
            raise not_found("file", e, "input_file_id") from None
        if file.purpose != "batch":
            raise bad_request(f"file {file.id!r} is not a batch input file (purpose {file.purpose})",
                              param="input_file_id")
        count, errors = await asyncio.to_thread(batch_input.check, self.files.path(file.id), body.endpoint)
        batch = new_batch(f"batch_{uuid.uuid4().hex}", body.endpoint, file.id, count,
                          WINDOW_S[body.completion_window], body.completion_window, body.metadata)
        if errors:  # refused as a whole, as OpenAI's validation refuses it
            batch = msgspec.structs.replace(batch, status="failed", in_progress_at=None, failed_at=batch.created_at,
                                            errors=BatchErrors(errors), request_counts=RequestCounts())
        self.store.put(batch, who, time.time_ns())
        if not errors:
            self.runner.start(batch)
        await request.json(200, batch)

    def _batch(self, request: Request) -> Batch:
        batch_id = request.path_params["batch_id"]
        try:
            if not batch_id.startswith("batch_"):  # (a message batch is read through Anthropic's API)
                raise MissingRecord(batch_id)
            return self.store.get(batch_id, context.key_id())
        except MissingRecord as e:
            raise not_found("batch", e) from None

    async def retrieve(self, request: Request) -> None:
        await request.json(200, self._batch(request))

    async def listed(self, request: Request) -> None:
        """Batches newest first, `limit` (1-100, default 20) at a time after `after`."""
        batches = [msgspec.to_builtins(b) for b in self.store.listed(context.key_id()) if b.endpoint in ENDPOINTS]
        await request.json(200, item_page(batches, request, "your batches"))

    async def cancel(self, request: Request) -> None:
        """A running batch becomes cancelling, then cancelled with the results it has; a finished
        one comes back as it is."""
        await request.json(200, self.runner.cancel(self._batch(request)))
