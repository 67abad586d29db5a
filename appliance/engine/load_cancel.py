"""Giving up a model load because the server is stopping.

A first load on a small box is long: the weights, K centring's calibration text and the
speculative exactness probe take minutes on a Raspberry Pi under a cold cache. systemd gives a
stopping unit `TimeoutStopSec` (30 s) before SIGKILL, so every long step of a load checks the
manager's stop flag between its llama.cpp calls (and llama.cpp's own weight load through its
progress callback) and raises `LoadCancelled` instead of finishing.
"""

from __future__ import annotations

import threading


class LoadCancelled(RuntimeError):
    def __init__(self) -> None:
        super().__init__("load cancelled: the server is stopping")


def raise_if_set(cancel: threading.Event | None) -> None:
    if cancel is not None and cancel.is_set():
        raise LoadCancelled()
