"""Open a shared library with ctypes, keeping the dynamic loader's own reason when it fails."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path


def _loader_error(path: Path) -> str | None:
    """dlopen's reason for `path` (a missing libcuda.so.1, say), or None if it loads now."""
    try:
        libc = ctypes.CDLL(None)
        libc.dlopen.restype, libc.dlopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_int]
        libc.dlerror.restype, libc.dlerror.argtypes = ctypes.c_char_p, []
        libc.dlerror()  # clears an earlier error
        if libc.dlopen(os.fsencode(path), os.RTLD_NOW | os.RTLD_LOCAL):
            return None
        reason = libc.dlerror()
    except (OSError, AttributeError):
        return None
    return reason.decode(errors="replace") if reason else None


def open_library(path: Path) -> ctypes.CDLL:
    """ctypes.CDLL(path); its OSError carries the loader's reason, which in a frozen program
    PyInstaller's ctypes replaces with "not found when the application was frozen"."""
    try:
        return ctypes.CDLL(str(path))
    except OSError as e:
        raise OSError(_loader_error(path) or str(e)) from e
