"""A stand-in for systemd's notify socket, shared by the sd_notify tests."""

from __future__ import annotations

import socket
import time


class NotifySocket:
    """What systemd listens on: an AF_UNIX datagram socket; collects every message."""

    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(path)
        self.sock.settimeout(0.05)
        self.addr = path
        self.messages: list[str] = []

    def drain(self) -> list[str]:
        new = []
        while True:
            try:
                new.append(self.sock.recv(4096).decode())
            except (socket.timeout, BlockingIOError):
                break
        self.messages += new
        return new

    def wait_for(self, prefix: str, timeout: float) -> str:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for m in self.drain():
                if any(line.startswith(prefix) for line in m.splitlines()):
                    return m
        raise AssertionError(f"no {prefix!r} in {timeout}s; got {self.messages[-10:]}")

    def close(self) -> None:
        self.sock.close()
