"""Stored Responses API responses: what GET /v1/responses/{id} returns and what
`previous_response_id` continues, bounded by count and bytes (least recently used dropped first).

They are held in memory and, with a directory, written there too (one JSON file each, written
off the event loop in order), so a conversation continues across a restart. At start only the
directory is listed (ids, sizes, the least-recently-used order by the files' times): a record a
previous run wrote is read when it is first asked for, so start-up does not read the store (up
to 64 MB by default) and memory holds only what is used. Each record keeps its own turns only
(its input messages and its answer) and the id of the response before it, so a long
conversation costs its length once, not once per turn."""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from .responses_schemas import Response, ResponseError
from .schemas import ChatMessage, encoder

log = logging.getLogger("eie.responses")


class Record(msgspec.Struct, frozen=True):
    """A stored response as its file holds it."""

    response: Response
    input_items: list[dict[str, Any]]
    turns: list[ChatMessage]  # this response's input and answer as chat messages
    owner: str | None  # the API key id that made it (None: the server has no keys)
    events: list[msgspec.Raw] | None = None  # a streamed background response's events, once it has ended
    truncated: int = 0  # the conversation's first messages its prompt left out (`truncation: auto`)


_record = msgspec.json.Decoder(Record)
UNFINISHED = ("queued", "in_progress")  # a background response's states before its end


@dataclass(frozen=True)
class Stored:
    response: Response
    input_items: list[dict[str, Any]]
    turns: list[ChatMessage]
    owner: str | None
    size: int  # bytes counted against the store's cap: the record's JSON
    events: list[bytes] | None = None  # each stream event's JSON (event_log.py), where they were kept
    truncated: int = 0


class MissingResponse(KeyError):
    """A response that is not stored (never was, deleted, dropped, or another key's)."""

    def __init__(self, response_id: str, why: str = "not found"):
        super().__init__(response_id)
        self.response_id = response_id
        self.why = why


@dataclass(frozen=True)
class OnDisk:
    """A record a previous run wrote, not read yet."""

    size: int


class ResponseStore:
    def __init__(self, max_entries: int, max_bytes: int, directory: Path | None = None):
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._records: OrderedDict[str, Stored | OnDisk] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.dropped = 0  # records dropped to stay under the caps
        self.directory = directory
        self._disk = ThreadPoolExecutor(1, "eie-responses") if directory is not None else None
        if directory is not None:
            self._read(directory)

    def _read(self, directory: Path) -> None:
        """The records a previous run wrote, least recently used first (listed, not read)."""
        try:
            directory.mkdir(parents=True, exist_ok=True)
            found = []
            for f in directory.glob("*.json"):
                st = f.stat()
                found.append((st.st_mtime_ns, f.stem, st.st_size))
        except OSError as e:
            log.warning("stored responses are kept in memory only: %s: %s", directory, e)
            self.directory = None
            return
        for _, response_id, size in sorted(found):
            self._records[response_id] = OnDisk(size)
            self._bytes += size
        with self._lock:
            self._trim()

    def _loaded(self, response_id: str, record: Stored | OnDisk) -> Stored | None:
        """The record, read from its file where a previous run wrote it (under the lock); None
        where that file no longer reads (it goes)."""
        if isinstance(record, Stored):
            return record
        path = self._file(response_id)
        try:
            data = path.read_bytes()
            rec = _record.decode(data)
            if rec.response.id != response_id:
                raise ValueError(f"it holds response {rec.response.id!r}")
        except (OSError, ValueError, msgspec.MsgspecError) as e:
            log.warning("dropping an unreadable stored response %s: %s", path.name, e)
            del self._records[response_id]
            self._bytes -= record.size
            self._forget(response_id)
            return None
        response = rec.response
        if response.status in UNFINISHED:  # a background response the previous run did not finish
            response = msgspec.structs.replace(response, status="failed", error=ResponseError(
                "server_restarted", "the server stopped before this background response finished"))
        events = [bytes(e) for e in rec.events] if rec.events is not None else None
        stored = Stored(response, rec.input_items, rec.turns, rec.owner, len(data), events, rec.truncated)
        self._records[response_id] = stored
        self._bytes += stored.size - record.size
        return stored

    def close(self) -> None:
        """Finish the queued writes (at shutdown)."""
        if self._disk is not None:
            self._disk.shutdown(wait=True)

    def _file(self, response_id: str) -> Path:
        return self.directory / f"{response_id}.json"

    def _on_disk(self, job, *args) -> None:
        if self._disk is not None and self.directory is not None:
            try:
                self._disk.submit(self._guarded, job, *args)
            except RuntimeError:  # closed at shutdown: a request that ended after it is kept in memory only
                log.warning("a stored response came after shutdown began; it is not written")

    @staticmethod
    def _guarded(job, *args) -> None:
        try:
            job(*args)
        except OSError as e:
            log.warning("a stored response's file: %s", e)

    def _write(self, path: Path, data: bytes) -> None:
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def _touch(self, path: Path) -> None:
        if path.exists():
            os.utime(path)  # the file's time keeps the least-recently-used order across a restart

    def __len__(self) -> int:
        return len(self._records)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put(self, response: Response, input_items: list[dict[str, Any]], turns: list[ChatMessage],
            owner: str | None, events: list[bytes] | None = None, truncated: int = 0) -> None:
        raw = [msgspec.Raw(e) for e in events] if events is not None else None
        data = encoder.encode(Record(response, input_items, turns, owner, raw, truncated))
        if self.max_entries == 0 or len(data) > self.max_bytes:
            return
        with self._lock:
            if (before := self._records.get(response.id)) is not None:  # a background response's later state
                self._bytes -= before.size
            self._records[response.id] = Stored(response, input_items, turns, owner, len(data), events, truncated)
            self._bytes += len(data)
            if self.directory is not None:
                self._on_disk(self._write, self._file(response.id), data)
            self._trim()

    def resize(self, max_entries: int, max_bytes: int) -> None:
        """New caps (a config reload); records over them go now, least recently used first."""
        with self._lock:
            self.max_entries, self.max_bytes = max_entries, max_bytes
            self._trim()

    def _trim(self) -> None:
        while self._records and (len(self._records) > self.max_entries or self._bytes > self.max_bytes):
            old_id, old = self._records.popitem(last=False)
            self._bytes -= old.size
            self.dropped += 1
            self._forget(old_id)

    def _forget(self, response_id: str) -> None:
        if self.directory is not None:
            self._on_disk(Path.unlink, self._file(response_id), True)

    def get(self, response_id: str, owner: str | None) -> Stored:
        """The record, marked as just used; MissingResponse if it is not there for this owner."""
        with self._lock:
            record = self._records.get(response_id)
            if record is not None:
                record = self._loaded(response_id, record)
            if record is None or not _may_read(record, owner):
                raise MissingResponse(response_id)
            self._records.move_to_end(response_id)
            if self.directory is not None:
                self._on_disk(self._touch, self._file(response_id))
            return record

    def delete(self, response_id: str, owner: str | None) -> None:
        with self._lock:
            record = self._records.get(response_id)
            if record is not None:
                record = self._loaded(response_id, record)
            if record is None or not _may_read(record, owner):
                raise MissingResponse(response_id)
            del self._records[response_id]
            self._bytes -= record.size
            self._forget(response_id)

    def conversation(self, response_id: str, owner: str | None) -> list[ChatMessage]:
        """Every turn up to and including `response_id`'s answer, oldest first (each response's
        `previous_response_id` followed back); every record on the way is marked as used."""
        chain: list[Stored] = []
        seen: set[str] = set()
        at: str | None = response_id
        while at is not None:
            if at in seen:
                break
            seen.add(at)
            try:
                record = self.get(at, owner)
            except MissingResponse:
                if at == response_id:
                    raise
                raise MissingResponse(response_id, f"an earlier response of its conversation, {at!r}, "
                                                   "is no longer stored") from None
            chain.append(record)
            at = record.response.previous_response_id
        return [turn for record in reversed(chain) for turn in record.turns]


def _may_read(record: Stored, owner: str | None) -> bool:
    return record.owner is None or record.owner == owner
