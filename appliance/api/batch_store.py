"""The Batch API's batches: each one's state (OpenAI's batch object) in `<id>.json`, and the
results of its requests as they finish, appended to `<id>.out.jsonl` (answered 2xx) and
`<id>.err.jsonl` (the others), so a batch a stopped server was running goes on after the
restart without its finished requests. All batches are held in memory (a batch's state is a few
hundred bytes; its results are files)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from .json_store import MissingRecord, may_read, write_atomically
from .schemas import Metadata, encoder

log = logging.getLogger("eie.batches")

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses")
UNFINISHED = ("validating", "in_progress", "finalizing", "cancelling")


class BatchCreate(msgspec.Struct, frozen=True, kw_only=True):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: Metadata | None = None


class LineError(msgspec.Struct, frozen=True, omit_defaults=False):
    code: str
    message: str
    param: str | None = None
    line: int | None = None


class BatchErrors(msgspec.Struct, frozen=True):
    data: list[LineError]
    object: str = "list"


class RequestCounts(msgspec.Struct, frozen=True):
    total: int = 0
    completed: int = 0
    failed: int = 0


class Batch(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: str = "batch"
    endpoint: str
    errors: BatchErrors | None = None
    input_file_id: str
    completion_window: str
    status: str
    output_file_id: str | None = None
    error_file_id: str | None = None
    created_at: int
    in_progress_at: int | None = None
    expires_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = RequestCounts()
    metadata: dict[str, str] | None = None


def new_batch(batch_id: str, endpoint: str, input_file_id: str, requests: int, window_s: int,
              completion_window: str = "24h", metadata: dict[str, str] | None = None) -> Batch:
    """A batch made now, in progress, with `requests` requests to run within `window_s` seconds."""
    created = int(time.time())
    return Batch(id=batch_id, endpoint=endpoint, input_file_id=input_file_id, completion_window=completion_window,
                 status="in_progress", created_at=created, in_progress_at=created, expires_at=created + window_s,
                 request_counts=RequestCounts(requests), metadata=metadata)


class _Kept(msgspec.Struct, frozen=True):
    batch: Batch
    owner: str | None
    stamp: int  # nanoseconds at creation: the listing's order


_kept = msgspec.json.Decoder(_Kept)


class BatchStore:
    def __init__(self, directory: Path):
        self.directory = directory
        self._batches: dict[str, _Kept] = {}
        self._lock = threading.Lock()
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # (the file store says so, and refuses uploads: no batch can start)
            log.warning("no batches can be kept: %s: %s", directory, e)
            return
        for f in directory.glob("*batch_*.json"):
            try:
                kept = _kept.decode(f.read_bytes())
            except (OSError, msgspec.MsgspecError) as e:
                log.warning("dropping an unreadable batch %s: %s", f.name, e)
                continue
            self._batches[kept.batch.id] = kept

    def put(self, batch: Batch, owner: str | None, stamp: int | None = None) -> Batch:
        """Keep this state of the batch. A write that fails (an OSError: a full disk) raises; a
        new batch is then not kept, a later state of one is kept in memory all the same (what
        this run goes by: a batch that cannot write its end still ends)."""
        with self._lock:
            before = self._batches.get(batch.id)
            kept = _Kept(batch, owner, stamp if stamp is not None else before.stamp)
            if before is not None:
                self._batches[batch.id] = kept
            write_atomically(self.directory / f"{batch.id}.json", encoder.encode(kept))
            self._batches[batch.id] = kept
            return batch

    def get(self, batch_id: str, owner: str | None) -> Batch:
        kept = self._batches.get(batch_id)
        if kept is None or not may_read(kept.owner, owner):
            raise MissingRecord(batch_id)
        return kept.batch

    def delete(self, batch_id: str) -> None:
        """The batch's state and its results not yet made files go."""
        with self._lock:
            self._batches.pop(batch_id, None)
            for path in (self.directory / f"{batch_id}.json", self.results(batch_id, False),
                         self.results(batch_id, True)):
                path.unlink(missing_ok=True)

    def owner_of(self, batch_id: str) -> str | None:
        return self._batches[batch_id].owner

    def listed(self, owner: str | None) -> list[Batch]:
        """This owner's batches, oldest first."""
        return [k.batch for k in sorted(self._batches.values(), key=lambda k: k.stamp)
                if may_read(k.owner, owner)]

    def file_user(self, file_id: str) -> str | None:
        """The batch that still needs a file: an unfinished batch reads its input file, and a
        message batch's files are its own (its results are read from them; it deletes them)."""
        for k in list(self._batches.values()):
            b = k.batch
            if b.id.startswith("msgbatch_") and file_id in (b.input_file_id, b.output_file_id, b.error_file_id):
                return b.id
            if b.status in UNFINISHED and file_id == b.input_file_id:
                return b.id
        return None

    def unfinished(self) -> list[Batch]:
        return [k.batch for k in self._batches.values() if k.batch.status in UNFINISHED]

    # ---- results ----------------------------------------------------------------------------

    def results(self, batch_id: str, failed: bool) -> Path:
        return self.directory / f"{batch_id}.{'err' if failed else 'out'}.jsonl"

    def append(self, batch_id: str, failed: bool, result: dict[str, Any]) -> None:
        with open(self.results(batch_id, failed), "ab") as f:
            f.write(encoder.encode(result) + b"\n")

    def finished_ids(self, batch_id: str) -> tuple[set[str], int, int]:
        """The custom ids of the requests that have a result, and how many answered 2xx and not."""
        done: set[str] = set()
        counts = [0, 0]
        for failed in (False, True):
            path = self.results(batch_id, failed)
            if not path.exists():
                continue
            data = path.read_bytes()
            if data and not data.endswith(b"\n"):  # a line the stop cut short: the request runs again
                data = data[:data.rfind(b"\n") + 1]
                with open(path, "r+b") as f:
                    f.truncate(len(data))
            for line in data.splitlines():
                try:
                    done.add(msgspec.json.decode(line)["custom_id"])
                except (msgspec.MsgspecError, KeyError, TypeError):
                    continue
                counts[failed] += 1
        return done, counts[0], counts[1]
