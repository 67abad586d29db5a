"""Records kept by id for the API's stored objects (responses, conversations), bounded by count
and bytes (least recently used dropped first), each readable only by the API key that made it.

They are held in memory and, with a directory, written there too (one JSON file each, written
off the event loop in order), so they outlive a restart. At start only the directory is listed
(ids, sizes, the least-recently-used order by the files' times): a record a previous run wrote
is read when it is first asked for, so start-up does not read the store and memory holds only
what is used."""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, TypeVar

import msgspec

from .errors import ApiError

log = logging.getLogger("eie.store")

V = TypeVar("V")


class MissingRecord(KeyError):
    """A record that is not stored (never was, deleted, dropped, or another key's)."""

    def __init__(self, record_id: str, why: str = "not found"):
        super().__init__(record_id)
        self.record_id = record_id
        self.why = why


class StoreUnavailable(ApiError):
    """A stored record's file could not be read just now (no file descriptors left, an I/O
    error): a 503 for this request, and the record stays for the next try."""

    def __init__(self, what: str, record_id: str, e: OSError):
        super().__init__(503, f"stored {what} {record_id!r} could not be read just now ({e.strerror or e}); "
                         "try again", type="service_unavailable", code="store_unavailable",
                         headers=[(b"retry-after", b"1")])


def write_atomically(path: Path, data: bytes) -> None:
    """`path` holds `data` whole, or what it held before (a crash never leaves half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def may_read(owner: str | None, reader: str | None) -> bool:
    """Whether `reader` (an API key id) may read what `owner` made (None: made without keys)."""
    return owner is None or owner == reader


def not_found(kind: str, e: MissingRecord, param: str | None = None) -> ApiError:
    """The 404 for a record that is not there (`kind`: response, conversation, file, batch)."""
    return ApiError(404, f"{kind} {e.record_id!r} is {e.why}", param=param, code=f"{kind}_not_found")


@dataclass
class _Entry(Generic[V]):
    value: V | None  # None: a record a previous run wrote, not read yet
    owner: str | None
    size: int  # bytes counted against the store's cap: the record's JSON (its file's size)
    appended: int = 0  # of which lines appended to the file since it was last written whole


class JsonStore(Generic[V]):
    def __init__(self, max_entries: int, max_bytes: int, directory: Path | None,
                 decode: Callable[[str, bytes], tuple[V, str | None]], what: str):
        """`decode(id, data)`: a file's record and its owner (raises ValueError or a msgspec
        error where it does not read); `what`: the records' name in log lines."""
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.what = what
        self._decode = decode
        self._records: OrderedDict[str, _Entry[V]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.dropped = 0  # records dropped to stay under the caps
        self.directory = directory
        self._disk = ThreadPoolExecutor(1, f"eie-{what}") if directory is not None else None
        if directory is not None:
            self._list(directory)

    def _list(self, directory: Path) -> None:
        """The records a previous run wrote, least recently used first (listed, not read)."""
        try:
            directory.mkdir(parents=True, exist_ok=True)
            found = []
            for f in directory.glob("*.json"):
                st = f.stat()
                found.append((st.st_mtime_ns, f.stem, st.st_size))
        except OSError as e:
            log.warning("stored %s are kept in memory only: %s: %s", self.what, directory, e)
            self.directory = None
            return
        for _, record_id, size in sorted(found):
            self._records[record_id] = _Entry(None, None, size)
            self._bytes += size
        with self._lock:
            self._trim()

    def _loaded(self, record_id: str, entry: _Entry[V]) -> _Entry[V] | None:
        """The entry, read from its file where a previous run wrote it (under the lock); None
        where that file no longer reads (it goes)."""
        if entry.value is not None:
            return entry
        return self._install(record_id, entry, self._read(record_id))

    def _read(self, record_id: str) -> tuple[V, str | None, int] | Exception:
        """A file a previous run wrote, decoded (record, owner, size), or why it does not read."""
        try:
            data = self._file(record_id).read_bytes()
            value, owner = self._decode(record_id, data)
        except (OSError, ValueError, msgspec.MsgspecError) as e:
            return e
        return value, owner, len(data)

    def _install(self, record_id: str, entry: _Entry[V], read: tuple[V, str | None, int] | Exception
                 ) -> _Entry[V] | None:
        """`entry` with what its file held (under the lock). A file that could not be read just
        now raises StoreUnavailable and its record stays; one that is gone, or reads but does not
        decode, drops its record, and the latter is set aside (renamed *.bad), never deleted."""
        if isinstance(read, OSError) and not isinstance(read, FileNotFoundError):
            log.warning("a stored record's file could not be read now: %s: %s", self._file(record_id).name, read)
            raise StoreUnavailable(self.what, record_id, read)
        if isinstance(read, Exception):
            del self._records[record_id]
            self._bytes -= entry.size
            if not isinstance(read, FileNotFoundError):
                log.error("a stored record's file does not read; set aside as %s.bad: %s",
                          self._file(record_id).name, read)
                self._on_disk(self._set_aside, self._file(record_id))
            return None
        entry.value, entry.owner, size = read
        self._bytes += size - entry.size
        entry.size = size
        return entry

    def close(self) -> None:
        """Finish the queued writes (at shutdown)."""
        if self._disk is not None:
            self._disk.shutdown(wait=True)

    def _file(self, record_id: str) -> Path:
        return self.directory / f"{record_id}.json"

    def _on_disk(self, job, *args) -> None:
        if self._disk is not None and self.directory is not None:
            try:
                self._disk.submit(self._guarded, job, *args)
            except RuntimeError:  # closed at shutdown: a record that came after it is kept in memory only
                log.warning("a stored record came after shutdown began; it is not written")

    @staticmethod
    def _guarded(job, *args) -> None:
        try:
            job(*args)
        except OSError as e:
            log.warning("a stored record's file: %s", e)

    @staticmethod
    def _set_aside(path: Path) -> None:
        os.replace(path, path.with_name(path.name + ".bad"))

    @staticmethod
    def _touch(path: Path) -> None:
        if path.exists():
            os.utime(path)  # the file's time keeps the least-recently-used order across a restart

    def __len__(self) -> int:
        return len(self._records)

    @property
    def bytes(self) -> int:
        return self._bytes

    def put_record(self, record_id: str, value: V, owner: str | None, data: bytes) -> bool:
        """Keep `value` (its file holds `data`), in place of an earlier state of it; one larger
        than the whole cap is not kept (False)."""
        if self.max_entries == 0 or len(data) > self.max_bytes:
            return False
        with self._lock:
            if (before := self._records.get(record_id)) is not None:
                self._bytes -= before.size
            self._records[record_id] = _Entry(value, owner, len(data))
            self._records.move_to_end(record_id)
            self._bytes += len(data)
            if self.directory is not None:
                self._on_disk(write_atomically, self._file(record_id), data)
            self._trim()
            return True

    def append_record(self, record_id: str, value: V, owner: str | None, tail: bytes,
                      whole: Callable[[], bytes]) -> bool:
        """Keep `value`, the stored record with more at its end: its file gets `tail` (b"\\n" and a
        JSON line its decode function applies) appended instead of being written again, until
        its appended lines outweigh the rest and it is written whole (`whole()`: its JSON), so a
        record that grows by appends costs a few times its size in writes, not its size per
        append. False where it would be larger than the whole cap (not kept: the stored record
        stays)."""
        with self._lock:
            entry = self._records.get(record_id)
            if entry is not None and entry.value is not None:
                if (self.max_entries and entry.appended + len(tail) <= entry.size - entry.appended
                        and entry.size + len(tail) <= self.max_bytes):
                    entry.value, entry.owner = value, owner
                    entry.size += len(tail)
                    entry.appended += len(tail)
                    self._bytes += len(tail)
                    self._records.move_to_end(record_id)
                    if self.directory is not None:
                        self._on_disk(self._append, self._file(record_id), tail)
                    self._trim()
                    return True
        return self.put_record(record_id, value, owner, whole())

    @staticmethod
    def _append(path: Path, tail: bytes) -> None:
        if not path.exists():  # its whole write failed (logged): a lone tail would not read
            log.warning("a stored record's file %s is missing; its new part is in memory only", path.name)
            return
        with path.open("ab") as f:
            f.write(tail)

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

    def _forget(self, record_id: str) -> None:
        if self.directory is not None:
            self._on_disk(Path.unlink, self._file(record_id), True)

    def _readable(self, record_id: str, owner: str | None) -> _Entry[V]:
        """The entry for this owner (under the lock), read where need be."""
        entry = self._records.get(record_id)
        if entry is not None:
            entry = self._loaded(record_id, entry)
        if entry is None or not may_read(entry.owner, owner):
            raise MissingRecord(record_id)
        return entry

    def get_record(self, record_id: str, owner: str | None) -> V:
        """The record, marked as just used; MissingRecord if it is not there for this owner."""
        with self._lock:
            entry = self._readable(record_id, owner)
            self._records.move_to_end(record_id)
            if self.directory is not None:
                self._on_disk(self._touch, self._file(record_id))
            return entry.value

    def readable(self, owner: str | None) -> list[tuple[str, V]]:
        """Every record `owner` may read, least recently used first, read from its file where a
        previous run wrote it (blocking: call it off the event loop); none is marked as used."""
        with self._lock:
            unread = [record_id for record_id, entry in self._records.items() if entry.value is None]
        for record_id in unread:  # each file read outside the lock: the event loop's puts and gets go on
            read = self._read(record_id)
            with self._lock:
                entry = self._records.get(record_id)
                if entry is not None and entry.value is None:
                    try:
                        self._install(record_id, entry, read)
                    except StoreUnavailable:
                        pass  # not listed this time; read again at the next ask
        with self._lock:
            return [(record_id, entry.value) for record_id, entry in self._records.items()
                    if entry.value is not None and may_read(entry.owner, owner)]

    def delete(self, record_id: str, owner: str | None) -> None:
        with self._lock:
            entry = self._readable(record_id, owner)
            del self._records[record_id]
            self._bytes -= entry.size
            self._forget(record_id)
