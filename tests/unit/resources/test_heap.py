"""heap.trim gives the free pages of a thread's malloc arena back to the system, as it must
after a model's buffers are freed."""

import subprocess
import sys
import textwrap

import pytest

from appliance.resources import heap

# In a child process, so that this one's heap is left alone: a worker thread (its own arena)
# allocates 64 blocks of 1 MiB under a raised mmap threshold, the way llama.cpp's buffers come
# from an arena once a larger buffer has been freed, fills them, and frees all but the last
# (which keeps the arena from shrinking by itself). Prints RSS before and after trim, in MiB.
CHILD = textwrap.dedent("""
    import ctypes, threading
    from appliance.resources import heap

    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallopt(-3, 64 << 20)  # M_MMAP_THRESHOLD: 1 MiB blocks from the arena

    def rss():
        return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20

    def work():
        blocks = [libc.malloc(1 << 20) for _ in range(64)]
        for b in blocks:
            ctypes.memset(b, 1, 1 << 20)
        for b in blocks[:-1]:
            libc.free(b)

    t = threading.Thread(target=work)
    t.start(); t.join()
    before = rss()
    gave_back = heap.trim()
    print(before, rss(), gave_back)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux") or heap._trim_function() is None,
                    reason="malloc_trim is glibc's")
def test_trim_returns_freed_arena_pages():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout
    before, after, gave_back = out.split()
    assert gave_back == "True"
    assert float(before) - float(after) > 48, out  # most of the 63 MiB freed

