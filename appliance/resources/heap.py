"""Give the C heap's free memory back to the system once a model's buffers are freed.

llama.cpp allocates a context's KV cache and compute buffers with posix_memalign. glibc serves
blocks under its mmap threshold from per-thread arenas, and that threshold grows to the largest
block freed so far (up to 32 MiB). After a model has been loaded and unloaded once, its buffers
come from the arenas of whichever threads loaded and served it, and freeing them leaves holes
that glibc keeps: the resident size of an idle appliance then grows with every load/unload cycle
under concurrent traffic. `malloc_trim(0)` returns the free pages of every arena to the system.

Elsewhere (musl, macOS) there is nothing to call and `trim()` answers False.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Callable


@functools.cache
def _trim_function() -> Callable[[int], int] | None:
    try:
        fn = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def trim() -> bool:
    """Return the free pages of every malloc arena to the system (glibc's malloc_trim(0)).
    True when memory was given back; False when none was, or the C library has no such call."""
    fn = _trim_function()
    return bool(fn(0)) if fn is not None else False
