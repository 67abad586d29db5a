"""Minimal ASGI request/response helpers (uvicorn parses HTTP; this only shapes messages)."""

from __future__ import annotations

import asyncio
from urllib.parse import parse_qs
from typing import Any, Awaitable, Callable

from .errors import ApiError
from .schemas import encoder

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON = b"application/json"


class Request:
    def __init__(self, scope: dict[str, Any], receive: Receive, send: Send):
        self.scope = scope
        self.receive = receive
        self.send = send
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        self.headers: dict[bytes, bytes] = {k.lower(): v for k, v in scope.get("headers", [])}
        self.disconnected = asyncio.Event()
        self._body_done = False
        self.raw_body = b""  # the body once read (for the audit trail)
        self.path_params: dict[str, str] = {}  # the route's {name} segments
        self.template: str | None = None  # the route's path with {name} segments, where it has them
        self.error_body: Callable[[ApiError], bytes] = ApiError.body  # the route's error envelope

    def query(self, key: str) -> str | None:
        """The first value of a query-string parameter (None: not given)."""
        values = parse_qs(self.scope.get("query_string", b"").decode("latin-1")).get(key)
        return values[0] if values else None

    def header(self, name: str) -> str | None:
        v = self.headers.get(name.lower().encode())
        return v.decode("latin-1") if v is not None else None

    async def body(self, limit: int) -> bytes:
        declared = self.header("content-length")
        if declared is not None:
            try:
                if int(declared) > limit:
                    raise ApiError(413, f"request body exceeds {limit} bytes", code="request_too_large")
            except ValueError:
                raise ApiError(400, "invalid Content-Length header") from None
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                self.disconnected.set()
                raise ApiError(499, "client disconnected")
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"request body exceeds {limit} bytes", code="request_too_large")
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        self._body_done = True
        self.raw_body = b"".join(chunks)
        return self.raw_body

    async def watch_disconnect(self) -> None:
        """Runs as a task once the body is read; sets `disconnected` when the client goes away."""
        while True:
            msg = await self.receive()
            if msg["type"] == "http.disconnect":
                self.disconnected.set()
                return

    async def respond(
        self, status: int, body: bytes, content_type: bytes = JSON, headers: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        hdrs = [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]
        hdrs.extend(headers or [])
        await self.send({"type": "http.response.start", "status": status, "headers": hdrs})
        await self.send({"type": "http.response.body", "body": body})

    async def json(self, status: int, obj: Any, headers: list[tuple[bytes, bytes]] | None = None) -> None:
        await self.respond(status, encoder.encode(obj), JSON, headers)

    async def error(self, err: ApiError) -> None:
        await self.respond(err.status, self.error_body(err), JSON, err.headers)


class EventStream:
    """Server-sent events (or another streamed body: `content_type`); the response starts with the
    first event, so errors before it keep their status."""

    def __init__(self, request: Request, headers: list[tuple[bytes, bytes]] | None = None,
                 content_type: bytes = b"text/event-stream"):
        self.request = request
        self.started = False
        self.extra_headers = headers or []
        self.content_type = content_type

    async def _start(self) -> None:
        headers = [
            (b"content-type", self.content_type),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        await self.request.send(
            {"type": "http.response.start", "status": 200, "headers": headers + self.extra_headers}
        )
        self.started = True

    async def event(self, obj: Any) -> None:
        await self.raw(b"data: " + encoder.encode(obj) + b"\n\n")

    async def raw(self, data: bytes) -> None:
        if not self.started:
            await self._start()
        await self.request.send({"type": "http.response.body", "body": data, "more_body": True})

    async def close(self) -> None:
        if not self.started:
            await self._start()
        await self.request.send({"type": "http.response.body", "body": b"", "more_body": False})
