"""OpenAI's Files API, for the Batch API's files: POST /v1/files (multipart: `file`, `purpose`
batch), GET /v1/files, GET/DELETE /v1/files/{file_id}, GET /v1/files/{file_id}/content."""

from __future__ import annotations

from typing import Callable

import msgspec

from ..config import Config
from ..observability import context
from .errors import ApiError, bad_request
from .file_store import FileObject, FileStore, FileTooLarge
from .http import Request
from .json_store import MissingRecord, not_found
from .multipart_upload import read_upload
from .item_pages import item_page

PURPOSES = ("batch",)  # what an upload may be for (batch_output: the files batches write)
_CHUNK = 1 << 20


class DeletedFile(msgspec.Struct, frozen=True):
    id: str
    object: str = "file"
    deleted: bool = True


class FilesRoutes:
    def __init__(self, config: Config, store: FileStore):
        self.config = config
        self.store = store
        # the batch that still needs a file, if one does (BatchStore.file_user; set by the app)
        self.user_of: Callable[[str], str | None] = lambda file_id: None

    async def upload(self, request: Request) -> None:
        if self.store.unavailable is not None:
            raise ApiError(503, f"this server cannot keep files: {self.store.unavailable}", type="service_unavailable",
                           code="files_unavailable")
        scratch = self.store.scratch()
        try:
            form = await read_upload(request, self.config.server.files.max_file_mb << 20, "file", scratch)
            purpose = form.fields.get("purpose")
            if purpose not in PURPOSES:
                raise bad_request(f"purpose must be one of {', '.join(PURPOSES)} (this server's files are "
                                  "batch input files)", param="purpose")
            if form.filename is None:
                raise bad_request("the form has no file part (field: file)", param="file")
            try:
                file = self.store.add(scratch, form.filename, purpose, context.key_id())
            except FileTooLarge as e:
                raise ApiError(413, str(e), code="files_full") from None
        finally:
            scratch.unlink(missing_ok=True)
        await request.json(200, file)

    def _file(self, request: Request) -> FileObject:
        try:
            return self.store.get(request.path_params["file_id"], context.key_id())
        except MissingRecord as e:
            raise not_found("file", e) from None

    async def listed(self, request: Request) -> None:
        """Files newest first unless `order=asc`, `limit` (1-10000) at a time after `after`, of one
        `purpose` where it is given."""
        files = [msgspec.to_builtins(f) for f in self.store.listed(context.key_id(), request.query("purpose"))]
        await request.json(200, item_page(files, request, "your files", 10_000, 10_000))

    async def retrieve(self, request: Request) -> None:
        await request.json(200, self._file(request))

    async def delete(self, request: Request) -> None:
        file = self._file(request)
        if (batch_id := self.user_of(file.id)) is not None:
            how = "delete the message batch instead" if batch_id.startswith("msgbatch_") else \
                "it reads it until it ends: cancel it, or delete the file once it has ended"
            raise ApiError(409, f"file {file.id!r} belongs to batch {batch_id!r}: {how}", param="file_id",
                           code="file_in_use")
        self.store.delete(file.id, context.key_id())
        await request.json(200, DeletedFile(file.id))

    async def content(self, request: Request) -> None:
        """The file's bytes, read from disk a piece at a time."""
        file = self._file(request)
        with open(self.store.path(file.id), "rb") as f:
            await request.send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"application/octet-stream"), (b"content-length", str(file.bytes).encode())]})
            while chunk := f.read(_CHUNK):
                await request.send({"type": "http.response.body", "body": chunk, "more_body": True})
            await request.send({"type": "http.response.body", "body": b""})
