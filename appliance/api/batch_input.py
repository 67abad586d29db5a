"""A batch's input file (JSON lines of `{custom_id, method, url, body}`), read a line at a time:
checked once, as a whole, when the batch is made (`check`, off the event loop), then read again
as its requests run (`requests`), so a file of 50,000 requests is never held in memory whole."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import msgspec

from .batch_store import LineError

MAX_LINES = 50_000
MAX_ERRORS = 100  # a file with this many bad lines is refused naming these


@dataclass(frozen=True)
class Line:
    number: int  # 1-based, in the input file
    custom_id: str
    method: str
    url: str
    body: bytes


def _parse(raw: bytes, number: int, endpoint: str, seen: set[str]) -> Line | LineError | None:
    """One line: its request, what is wrong with it, or None for a blank one. A good line's
    custom_id joins `seen`."""
    if not raw.strip():
        return None
    try:
        obj = msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return LineError("invalid_json_line", "the line is not JSON", line=number)
    if not isinstance(obj, dict):
        return LineError("invalid_request", "the line is not a JSON object", line=number)
    custom_id, method, url, body = obj.get("custom_id"), obj.get("method"), obj.get("url"), obj.get("body")
    if not isinstance(custom_id, str) or not custom_id:
        return LineError("missing_required_parameter", "custom_id must be a non-empty string", "custom_id", number)
    if custom_id in seen:
        return LineError("duplicate_custom_id", f"custom_id {custom_id!r} is on an earlier line", "custom_id", number)
    if method != "POST":
        return LineError("invalid_method", "method must be POST", "method", number)
    if url != endpoint:
        return LineError("mismatched_endpoint", f"url must be the batch's endpoint {endpoint}", "url", number)
    if not isinstance(body, dict):
        return LineError("invalid_request", "body must be a JSON object", "body", number)
    for answered_whole in ("stream", "background"):
        if body.get(answered_whole):
            return LineError("invalid_request", f"a batch's requests are answered whole: leave {answered_whole} out",
                             f"body.{answered_whole}", number)
    seen.add(custom_id)
    return Line(number, custom_id, method, url, msgspec.json.encode(body))


def check(path: Path, endpoint: str) -> tuple[int, list[LineError]]:
    """How many requests the file holds, or the errors that refuse the batch (each naming its
    line; the first MAX_ERRORS). Reads the file; call it off the event loop."""
    count, errors, seen = 0, [], set()
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            parsed = _parse(raw, number, endpoint, seen)
            if isinstance(parsed, Line):
                count += 1
            elif parsed is not None:
                errors.append(parsed)
                if len(errors) >= MAX_ERRORS:
                    break
    if not errors and not count:
        errors.append(LineError("empty_file", "the input file has no requests"))
    if count > MAX_LINES:
        errors.append(LineError("too_many_requests", f"a batch has at most {MAX_LINES} requests"))
    return count, errors


def requests(path: Path, endpoint: str) -> Iterator[Line]:
    """The file's requests in order, read as they are asked for (a file `check` passed)."""
    seen: set[str] = set()
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            parsed = _parse(raw, number, endpoint, seen)
            if isinstance(parsed, Line):
                yield parsed
