"""Give the C heap's free memory back to the system once a model's buffers are freed.

llama.cpp allocates a context's KV cache and compute buffers with posix_memalign. glibc serves
blocks under its mmap threshold from per-thread arenas, and that threshold grows to the largest
block freed so far (up to 32 MiB). After a model has been loaded and unloaded once, its buffers
come from the arenas of whichever threads loaded and served it, and freeing them leaves holes
that glibc keeps: the resident size of an idle appliance then grows with every load/unload cycle
under concurrent traffic. `malloc_trim(0)` returns the free pages of every arena to the system.

glibc also gives threads arenas of their own, up to 8 per core: the event loop, the runners, the
loaders and the executor's threads each fragment theirs. `limit_arenas` caps them (2 by default,
as `MALLOC_ARENA_MAX=2` would) unless the environment already does.
Elsewhere (musl, macOS) there is nothing to call: `trim()` answers False and `limit_arenas()`
None. `EIE_HEAP=0` turns both off (bench/unload_cycles.py compares).
"""

from __future__ import annotations

import ctypes
import functools
import os
from typing import Callable

M_ARENA_MAX = -8  # mallopt's parameter, from glibc's malloc.h
DEFAULT_ARENAS = 2


@functools.cache
def _libc() -> ctypes.CDLL | None:
    if os.environ.get("EIE_HEAP") == "0":
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None  # glibc's only


@functools.cache
def _trim_function() -> Callable[[int], int] | None:
    libc = _libc()
    if libc is None:
        return None
    fn = libc.malloc_trim
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def trim() -> bool:
    """Return the free pages of every malloc arena to the system (glibc's malloc_trim(0)).
    True when memory was given back; False when none was, or the C library has no such call."""
    fn = _trim_function()
    return bool(fn(0)) if fn is not None else False


def limit_arenas(arenas: int = DEFAULT_ARENAS) -> int | None:
    """Cap glibc's malloc arenas at `arenas`, before the server starts its threads. The
    environment's own setting (MALLOC_ARENA_MAX, or arena_max in GLIBC_TUNABLES) wins. Returns the
    cap set here, or None when nothing was set."""
    if "MALLOC_ARENA_MAX" in os.environ or "arena_max" in os.environ.get("GLIBC_TUNABLES", ""):
        return None
    libc = _libc()
    if libc is None:
        return None
    libc.mallopt.argtypes, libc.mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return arenas if libc.mallopt(M_ARENA_MAX, arenas) == 1 else None
