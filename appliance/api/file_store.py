"""The Files API's files: uploads (a batch's requests) and the files batches write (their
results and errors), each kept on disk as `<id>.bin` with its description in `<id>.json`,
readable only by the API key that made it, all together under a byte cap."""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from pathlib import Path

import msgspec

from .json_store import MissingRecord, may_read, write_atomically
from .schemas import encoder

log = logging.getLogger("eie.files")


class FileObject(msgspec.Struct, frozen=True, kw_only=True):
    id: str
    object: str = "file"
    bytes: int
    created_at: int
    filename: str
    purpose: str  # batch (an upload) | batch_output (a batch's results or errors)
    status: str = "processed"
    expires_at: int | None = None
    status_details: str | None = None


class _Described(msgspec.Struct, frozen=True):
    file: FileObject
    owner: str | None
    stamp: int = 0  # its time in nanoseconds: the listing's order


_described = msgspec.json.Decoder(_Described)


class FileTooLarge(Exception):
    """The file would take the files past their cap."""


class FileStore:
    def __init__(self, directory: Path, max_bytes: int):
        self.directory = directory
        self.max_bytes = max_bytes
        self._files: dict[str, _Described] = {}
        self._lock = threading.Lock()
        self.unavailable: str | None = None  # why files cannot be kept (the directory cannot be made)
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            self.unavailable = f"{directory}: {e}"
            log.warning("the Files and Batch APIs are off: %s", self.unavailable)
            return
        for meta in directory.glob("file-*.json"):
            try:
                described = _described.decode(meta.read_bytes())
                if not self.path(described.file.id).is_file():
                    raise ValueError("its content is missing")
            except (OSError, ValueError, msgspec.MsgspecError) as e:
                log.warning("dropping an unreadable file description %s: %s", meta.name, e)
                meta.unlink(missing_ok=True)
                continue
            self._files[described.file.id] = described
        for stale in directory.glob(".upload-*"):  # an upload a previous run did not finish
            stale.unlink(missing_ok=True)

    @property
    def bytes(self) -> int:
        return sum(d.file.bytes for d in self._files.values())

    def path(self, file_id: str) -> Path:
        return self.directory / f"{file_id}.bin"

    def scratch(self) -> Path:
        """A new file to write an upload or a batch's results into, before `add`."""
        return self.directory / f".upload-{uuid.uuid4().hex}"

    def add(self, scratch: Path, filename: str, purpose: str, owner: str | None) -> FileObject:
        """Keep `scratch` as a file (it is moved); FileTooLarge if the files would pass their cap."""
        size = scratch.stat().st_size
        with self._lock:
            if self.bytes + size > self.max_bytes:
                scratch.unlink(missing_ok=True)
                raise FileTooLarge(f"the files would take {self.bytes + size} bytes; this server keeps "
                                   f"{self.max_bytes} (server.files.max_mb)")
            file = FileObject(id=f"file-{uuid.uuid4().hex}", bytes=size, created_at=int(time.time()),
                              filename=filename, purpose=purpose)
            os.replace(scratch, self.path(file.id))
            described = _Described(file, owner, time.time_ns())
            write_atomically(self.directory / f"{file.id}.json", encoder.encode(described))
            self._files[file.id] = described
            return file

    def get(self, file_id: str, owner: str | None) -> FileObject:
        described = self._files.get(file_id)
        if described is None or not may_read(described.owner, owner):
            raise MissingRecord(file_id)
        return described.file

    def listed(self, owner: str | None, purpose: str | None = None) -> list[FileObject]:
        """This owner's files, oldest first."""
        return [d.file for d in sorted(self._files.values(), key=lambda d: d.stamp)
                if may_read(d.owner, owner) and (purpose is None or d.file.purpose == purpose)]

    def delete(self, file_id: str, owner: str | None) -> None:
        self.get(file_id, owner)
        with self._lock:
            del self._files[file_id]
            (self.directory / f"{file_id}.json").unlink(missing_ok=True)
            self.path(file_id).unlink(missing_ok=True)
