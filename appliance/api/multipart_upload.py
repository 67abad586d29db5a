"""A multipart/form-data upload (POST /v1/files) read as it comes: its file part written to disk,
its other fields kept as text. The parsing is python-multipart's."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from python_multipart.multipart import MultipartParser, parse_options_header

from .errors import ApiError, bad_request
from .http import Request

_FIELD_LIMIT = 4096  # a text field's bytes at most
_FORM_OVERHEAD = 64 * 1024  # the form's boundaries, part headers and text fields, beyond the file


@dataclass
class Upload:
    fields: dict[str, str] = field(default_factory=dict)
    filename: str | None = None  # the file part's name; None: the form had no file part


async def read_upload(request: Request, limit: int, file_field: str, scratch: Path) -> Upload:
    """The form's fields, with the part named `file_field` (at most `limit` bytes: the file's own,
    not the form's boundaries and headers) written to `scratch`."""
    kind, options = parse_options_header(request.header("content-type") or "")
    boundary = options.get(b"boundary")
    if kind != b"multipart/form-data" or not boundary:
        raise ApiError(415, "send the file as multipart/form-data (fields: file, purpose)",
                       code="unsupported_media_type")
    upload = Upload()
    state: dict = {"header": b"", "value": b"", "headers": {}, "name": None, "text": None, "out": None,
                   "file_bytes": 0}

    def header_end() -> None:
        state["headers"][state["header"].lower()] = state["value"]
        state["header"] = state["value"] = b""

    def headers_finished() -> None:
        _, disposition = parse_options_header(state["headers"].get(b"content-disposition", b""))
        name = disposition.get(b"name", b"").decode("utf-8", "replace")
        state["name"] = name
        if name == file_field:
            upload.filename = disposition.get(b"filename", b"upload").decode("utf-8", "replace")
            state["out"] = open(scratch, "wb")
        else:
            state["text"] = bytearray()

    def part_data(data: bytes, start: int, end: int) -> None:
        if state["out"] is not None:
            state["file_bytes"] += end - start
            if state["file_bytes"] > limit:
                raise ApiError(413, f"the file is larger than {limit} bytes (server.files.max_file_mb)",
                               param=file_field, code="request_too_large")
            state["out"].write(data[start:end])
        else:
            state["text"] += data[start:end]
            if len(state["text"]) > _FIELD_LIMIT:
                raise bad_request(f"form field {state['name']!r} is longer than {_FIELD_LIMIT} bytes",
                                  param=state["name"])

    def part_end() -> None:
        if state["out"] is not None:
            state["out"].close()
            state["out"] = None
        elif state["text"] is not None:
            upload.fields[state["name"]] = state["text"].decode("utf-8", "replace")
        state["headers"], state["text"] = {}, None

    def append(key: str):
        def on(data: bytes, start: int, end: int) -> None:
            state[key] += data[start:end]
        return on

    parser = MultipartParser(boundary, {
        "on_header_field": append("header"), "on_header_value": append("value"), "on_header_end": header_end,
        "on_headers_finished": headers_finished, "on_part_data": part_data, "on_part_end": part_end})
    try:
        async for chunk in request.chunks(limit + _FORM_OVERHEAD):
            parser.write(chunk)
        parser.finalize()
    except ValueError as e:  # python-multipart's malformed-form errors are ValueErrors
        raise bad_request(f"the multipart form does not read: {e}") from None
    finally:
        if state["out"] is not None:
            state["out"].close()
    return upload
