"""`eie serve`'s process: uvicorn with a drain on SIGTERM and a config reload on SIGHUP.

SIGTERM (systemd stop): /health turns 503 `draining`, new requests get 503 `draining`, in-flight
requests finish within `server.drain_grace_s` (the rest end with a shutdown error), then uvicorn
stops; the lifespan shutdown stops the runners (their prefix stores finish the queued disk
writes) and closes the audit trail; the process exits 0. A second SIGTERM or SIGINT stops at once.
SIGHUP: the config file is read again as POST /v1/admin/config/reload does.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from types import FrameType
from typing import Any, Callable

import uvicorn

from .api.app import App

log = logging.getLogger("eie.server")


TICK_S = 1.0  # uvicorn's housekeeping tick (its date header's resolution is a second anyway)


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: App):
        self._exit_asked = False
        self._wake: tuple[asyncio.AbstractEventLoop, asyncio.Event] | None = None
        super().__init__(config)
        self.eie = app
        self._drain_task: asyncio.Task | None = None
        self._stop_task: asyncio.Task | None = None
        # told when the shutdown begins (why, the longest it may take): systemd's STOPPING=1
        self.on_stopping: Callable[[str, float], None] = lambda _why, _longest_s: None

    @property
    def should_exit(self) -> bool:  # type: ignore[override]
        return self._exit_asked

    @should_exit.setter
    def should_exit(self, value: bool) -> None:
        self._exit_asked = value
        if value and self._wake is not None:  # the main loop sees it now, not at its next tick
            loop, event = self._wake
            loop.call_soon_threadsafe(event.set)

    async def main_loop(self) -> None:
        """uvicorn's main loop, ticking once a second instead of ten times (a bare uvicorn idles at
        about 0.9 % of a core here, most of it those wake-ups) and woken at once by an exit."""
        event = asyncio.Event()
        self._wake = (asyncio.get_running_loop(), event)
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000  # on_tick refreshes the date header when counter % 10 == 0
            try:
                await asyncio.wait_for(event.wait(), TICK_S)
            except TimeoutError:
                pass
            should_exit = await self.on_tick(counter)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """A first SIGTERM drains; a second one, or SIGINT, stops without waiting: the live answers
        end now with the shutdown error (uvicorn's own exit waited 10 s for their connections, then
        cut the streams mid-body); one more leaves it to uvicorn."""
        loop = self.eie.loop
        if loop is not None and not self.should_exit and self._stop_task is None:
            self._captured_signals.append(sig)
            loop.call_soon_threadsafe(self._start_drain if sig == signal.SIGTERM and self._drain_task is None
                                      else self._start_stop)
            return
        super().handle_exit(sig, frame)

    def _start_drain(self) -> None:
        if self._drain_task is None:
            grace = self.eie.config.server.drain_grace_s
            self.on_stopping(f"draining: {self.eie.in_flight} requests in flight, up to {grace:g}s", grace)
            self._drain_task = asyncio.ensure_future(self._drain())

    def _start_stop(self) -> None:
        if self._stop_task is None:
            self.on_stopping("stopping now", 0.0)
            self._stop_task = asyncio.ensure_future(self._stop_now())

    async def _stop_now(self) -> None:
        try:
            await self.eie.stop_now()
        finally:
            self.should_exit = True

    async def _drain(self) -> None:
        try:
            await self.eie.drain(self.eie.config.server.drain_grace_s)
        finally:
            self.should_exit = True

    def reload(self, *_: Any) -> None:
        loop = self.eie.loop
        if loop is not None:
            loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self.eie.reload_on_signal()))
        else:  # (the config being read is the file's as it is now)
            log.warning("SIGHUP while the server starts: ignored")


def build(app: App, host: str, port: int, log_level: str, wrap: Any = None) -> Server:
    """The server; `run()` it (after `install_signals`)."""
    uv = uvicorn.Config(
        wrap(app) if wrap else app,
        host=host,
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        access_log=False,
        log_level=log_level,
        log_config=None,  # our handler (observability/logs.py) formats uvicorn's lines too
        timeout_graceful_shutdown=10,
    )
    return Server(uv, app)


def install_signals(server: Server) -> None:
    # uvicorn shuts down on SIGTERM/SIGINT, then raises the signal again with the handler found
    # at start: a no-op one makes a clean stop exit 0.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    signal.signal(signal.SIGHUP, server.reload)
