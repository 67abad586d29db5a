"""Minimal ASGI request/response helpers (uvicorn parses HTTP; this only shapes messages)."""

from __future__ import annotations

import asyncio
import time
from urllib.parse import parse_qs
from typing import Any, AsyncIterator, Awaitable, Callable

from .errors import ApiError
from .schemas import encoder

Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON = b"application/json"



class ClientGone(OSError):
    """Sending to the client failed: its connection is gone (an OSError, as the server's
    transport raises, so code that stops on a lost client catches it as one)."""

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
        self.keepalive_s = 0.0  # server.stream_keepalive_s: an idle event stream's comment interval
        self.stream: EventStream | None = None  # the response's event stream, once a route opens one
        self.limit_holder: str | None = None  # whose per-key limits count it (set once it is admitted)

    def query(self, key: str) -> str | None:
        """The first value of a query-string parameter (None: not given)."""
        values = parse_qs(self.scope.get("query_string", b"").decode("latin-1")).get(key)
        return values[0] if values else None

    def header(self, name: str) -> str | None:
        v = self.headers.get(name.lower().encode())
        return v.decode("latin-1") if v is not None else None

    async def body(self, limit: int) -> bytes:
        self.raw_body = b"".join([chunk async for chunk in self.chunks(limit)])
        return self.raw_body

    async def chunks(self, limit: int) -> AsyncIterator[bytes]:
        """The body as it comes (an upload too large to hold), at most `limit` bytes (else a 413)."""
        declared = self.header("content-length")
        if declared is not None:
            try:
                if int(declared) > limit:
                    raise ApiError(413, f"request body exceeds {limit} bytes", code="request_too_large")
            except ValueError:
                raise ApiError(400, "invalid Content-Length header") from None
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
            yield chunk
            if not msg.get("more_body", False):
                break
        self._body_done = True

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


class DetachedRequest(Request):
    """A request nobody waits on: a background response's answer runs through the routes' own
    code with it (api/responses_background.py). What it sends is dropped, and `cancel()` reads to
    the generation as its client going away."""

    def __init__(self, like: Request):
        self._gone = asyncio.Event()
        super().__init__(like.scope, self._receive, self._send)
        self.raw_body = like.raw_body

    async def _receive(self) -> dict[str, Any]:
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict[str, Any]) -> None:
        pass

    def cancel(self) -> None:
        self._gone.set()

    async def cancelled_within(self, seconds: float) -> bool:
        """Wait up to `seconds`; True if it was cancelled meanwhile."""
        try:
            await asyncio.wait_for(self._gone.wait(), seconds)
            return True
        except asyncio.TimeoutError:
            return False

    @property
    def cancelled(self) -> bool:
        return self._gone.is_set()


class EventStream:
    """Server-sent events (or another streamed body: `content_type`); the response starts with the
    first event, so errors before it keep their status.

    An SSE stream with nothing to send for `request.keepalive_s` gets a comment line, so proxies
    and clients with idle timeouts keep it open while the request waits for a slot, its prompt is
    read or a group's earlier members answer. The first one starts the response: a failure after
    it goes in the stream, as one after the first event does."""

    def __init__(self, request: Request, headers: list[tuple[bytes, bytes]] | None = None,
                 content_type: bytes = b"text/event-stream"):
        self.request = request
        self.started = False
        self.closed = False
        self.extra_headers = headers or []
        self.content_type = content_type
        self._sending = 0
        self._last = time.monotonic()
        self._ticker: asyncio.Task[None] | None = None
        if (prior := request.stream) is not None:  # one opened while the model loaded: its response goes on
            prior.stop()
            self.started = prior.started
        request.stream = self
        if request.keepalive_s > 0 and content_type == b"text/event-stream":
            self._ticker = asyncio.ensure_future(self._keep_alive(request.keepalive_s))

    async def _start(self) -> None:
        headers = [
            (b"content-type", self.content_type),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),
        ]
        self.started = True
        await self.request.send(
            {"type": "http.response.start", "status": 200, "headers": headers + self.extra_headers}
        )

    async def _keep_alive(self, interval: float) -> None:
        try:
            while not self.closed:
                wait = self._last + interval - time.monotonic()
                if wait <= 0 and not self._sending:
                    await self.raw(b": keep-alive\n\n")
                else:  # (a send under way, to a slow reader, counts as activity)
                    await asyncio.sleep(wait if wait > 0 else interval)
        except (OSError, RuntimeError):
            pass  # the client went away, or the response ended meanwhile

    async def event(self, obj: Any) -> None:
        await self.raw(b"data: " + encoder.encode(obj) + b"\n\n")

    async def raw(self, data: bytes) -> None:
        self._sending += 1
        try:
            if not self.started:
                await self._start()
            await self.request.send({"type": "http.response.body", "body": data, "more_body": True})
        finally:
            self._sending -= 1
            self._last = time.monotonic()

    def stop(self) -> None:
        """No more keep-alives (the request is over, however it ended)."""
        self.closed = True
        if self._ticker is not None:
            self._ticker.cancel()

    async def close(self) -> None:
        self.stop()
        if not self.started:
            await self._start()
        await self.request.send({"type": "http.response.body", "body": b"", "more_body": False})
