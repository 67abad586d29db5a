"""systemd's notify protocol (Type=notify, WatchdogSec) over $NOTIFY_SOCKET, without a dependency.

`Supervisor` tells systemd how start-up goes (`STATUS=` per model, `EXTEND_TIMEOUT_USEC=` while
models load so a slow load is not killed by TimeoutStartSec, `READY=1` once the fixed set is
loaded and the port listens, `STOPPING=1` on the way out) and pings the watchdog (`WATCHDOG=1`,
every third of `WATCHDOG_USEC`) from its own thread, but only while the engine is healthy: the
event loop answers and no runner that has work stops making progress. A wedged engine stops the
pings and systemd restarts the service.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
import threading
import time
from typing import Any, Callable, Mapping

log = logging.getLogger("eie.systemd")


def notify(message: str, env: Mapping[str, str] | None = None) -> bool:
    """Send one datagram (`KEY=value` lines) to $NOTIFY_SOCKET; False when there is none or it fails."""
    addr = (env if env is not None else os.environ).get("NOTIFY_SOCKET")
    if not addr:
        return False
    if addr.startswith("@"):  # abstract namespace
        addr = "\0" + addr[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as s:
            s.connect(addr)
            s.sendall(message.encode("utf-8"))
        return True
    except OSError as e:
        log.warning("sd_notify to %s failed: %s", addr, e)
        return False


def watchdog_usec(env: Mapping[str, str] | None = None) -> int | None:
    """The watchdog period systemd asks for, when it is meant for this process."""
    env = env if env is not None else os.environ
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    pid = env.get("WATCHDOG_PID")
    if usec <= 0 or (pid and pid != str(os.getpid())):
        return None
    return usec


class EngineHealth:
    """Whether the engine still works: the event loop runs callbacks and every runner with work
    advances its token counters within `stall_s`."""

    def __init__(self, manager: Any, stall_s: float):
        self.manager = manager
        self.stall_s = stall_s
        self.loop: asyncio.AbstractEventLoop | None = None
        self._seen: dict[str, tuple[int, float]] = {}  # runner -> (progress, when it last changed)

    def problem(self) -> str | None:
        """None when healthy, else why not (checked from the watchdog thread)."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            done: concurrent.futures.Future[None] = concurrent.futures.Future()
            try:
                loop.call_soon_threadsafe(done.set_result, None)
                done.result(timeout=self.stall_s)
            except RuntimeError:
                pass  # the loop closed meanwhile: shutting down
            except concurrent.futures.TimeoutError:
                return f"event loop did not run a callback in {self.stall_s:g}s"
        now = time.monotonic()
        for name, r in list(self.manager.runners.items()):
            if r.state != "ready":
                self._seen.pop(name, None)
                continue
            thread = getattr(r, "_thread", None)
            if thread is not None and not thread.is_alive():
                return f"runner {name} thread has died"
            busy = r.running() + r.queue_depth()
            progress = r.stats["prefill_tokens"] + r.stats["decode_tokens"] + r.stats["sequences"]
            last = self._seen.get(name)
            if busy == 0 or last is None or last[0] != progress:
                self._seen[name] = (progress, now)
            elif now - last[1] > self.stall_s:
                return f"runner {name} made no progress for {now - last[1]:.0f}s with {busy} requests"
        return None


class Supervisor:
    """Start-up notifications and watchdog pings for one `eie serve` process."""

    def __init__(self, manager: Any, listening: Callable[[], bool], env: Mapping[str, str] | None = None,
                 stall_s: float | None = None, poll_s: float = 0.5):
        self.env = dict(env if env is not None else os.environ)
        self.manager = manager
        self.listening = listening
        usec = watchdog_usec(self.env)
        self.ping_s = usec / 3e6 if usec else None
        self.health = EngineHealth(manager, stall_s if stall_s is not None else max(usec / 1e6 if usec else 60, 1))
        self.poll_s = poll_s
        self.ready = False
        self._stop = threading.Event()
        self._stopping = threading.Event()  # STOPPING=1 went out
        self._threads: list[threading.Thread] = []
        self.enabled = bool(self.env.get("NOTIFY_SOCKET"))

    def send(self, message: str) -> bool:
        return notify(message, self.env)

    def wrap(self, app: Any) -> Any:
        """The ASGI app, taking note of its event loop for the health check."""
        health = self.health

        async def wrapped(scope: dict, receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                health.loop = asyncio.get_running_loop()
            await app(scope, receive, send)

        return wrapped

    def start(self) -> None:
        if not self.enabled:
            return
        for target, name in ((self._startup, "sd-startup"), (self._watchdog, "sd-watchdog")):
            if target == self._watchdog and not self.ping_s:
                continue
            t = threading.Thread(target=target, name=name, daemon=True)
            self._threads.append(t)
            t.start()

    def stopping(self, why: str, longest_s: float) -> None:
        """The shutdown begins (SIGTERM's drain, or a stop now): STOPPING=1 at once, as sd_notify
        has it, and the time it may take (`longest_s`) asked for, past the unit's TimeoutStopSec
        (systemd honours EXTEND_TIMEOUT_USEC while stopping); start-up notices end."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self.enabled:
            self.send(f"STOPPING=1\nSTATUS={why}\nEXTEND_TIMEOUT_USEC={int((longest_s + 15) * 1e6)}")

    def close(self) -> None:
        if self.enabled and not self._stopping.is_set():
            self.send("STOPPING=1\nSTATUS=stopping")
        self._stopping.set()
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)

    def status_line(self) -> tuple[bool, str]:
        """(boot finished, a STATUS= text) from the boot models' states."""
        boot = self.manager.boot_models()
        states = {n: self.manager.runners[n].state for n in boot}
        ready = [n for n, s in states.items() if s == "ready"]
        failed = [n for n, s in states.items() if s == "failed"]
        loading = [n for n, s in states.items() if s not in ("ready", "failed")]  # or not started yet
        if loading:
            return False, f"loading models: {len(ready)}/{len(boot)} ready, loading {', '.join(loading)}"
        if failed:
            return True, f"degraded: {len(ready)}/{len(boot)} models ready, failed: {', '.join(failed)}"
        return True, f"serving {len(ready)} models"

    def _startup(self) -> None:
        extend_us = int(max(30.0, 10 * self.poll_s) * 1e6)  # renewed well before it runs out
        last_status, last_extend = "", 0.0
        while not self._stop.is_set() and not self._stopping.is_set():
            done, status = self.status_line()
            if done and self.listening():
                self.send(f"READY=1\nSTATUS={status}")
                self.ready = True
                log.info("systemd: READY (%s)", status)
                return
            now = time.monotonic()
            if status != last_status or now - last_extend > extend_us / 3e6:
                self.send(f"EXTEND_TIMEOUT_USEC={extend_us}\nSTATUS={status}")
                last_status, last_extend = status, now
            self._stop.wait(self.poll_s)

    def _watchdog(self) -> None:
        assert self.ping_s
        wedged = False
        while not self._stop.is_set():
            problem = self.health.problem()
            if problem is None:
                self.send("WATCHDOG=1")
                if wedged:
                    log.warning("systemd watchdog: engine healthy again, pings resumed")
                    wedged = False
            elif not wedged:
                log.error("systemd watchdog: %s; pings stopped", problem)
                self.send(f"STATUS=wedged: {problem}")
                wedged = True
            self._stop.wait(self.ping_s)
