"""heap.trim gives the free pages of a thread's malloc arena back to the system, as it must
after a model's buffers are freed; heap.limit_arenas caps the arenas threads get."""

import os
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


needs_glibc = pytest.mark.skipif(heap._libc() is None, reason="malloc_trim and mallopt are glibc's")


@needs_glibc
def test_trim_returns_freed_arena_pages():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=True).stdout
    before, after, gave_back = out.split()
    assert gave_back == "True"
    assert float(before) - float(after) > 48, out  # most of the 63 MiB freed



# A child that caps the arenas (or not), lets 6 threads allocate, and prints how many arenas
# malloc_info reports.
ARENAS = textwrap.dedent("""
    import ctypes, os, sys, tempfile, threading
    from appliance.resources import heap

    set_here = heap.limit_arenas(2) if sys.argv[1] == "cap" else None
    libc = ctypes.CDLL(None)
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.fopen.restype, libc.fopen.argtypes = ctypes.c_void_p, [ctypes.c_char_p, ctypes.c_char_p]
    libc.malloc_info.argtypes, libc.fclose.argtypes = [ctypes.c_int, ctypes.c_void_p], [ctypes.c_void_p]
    go = threading.Barrier(6)

    def work():
        go.wait()
        libc.malloc(4096)  # a new thread's first malloc takes an arena of its own while it may

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    path = tempfile.mktemp()
    fp = libc.fopen(path.encode(), b"w")
    libc.malloc_info(0, fp)
    libc.fclose(fp)
    print(set_here, open(path).read().count("<heap nr="))
    os.unlink(path)
""")


@needs_glibc
def test_limit_arenas_caps_the_arenas_threads_get():
    def arenas(mode: str, **env: str) -> tuple[str, int]:
        clean = {k: v for k, v in os.environ.items() if k not in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES")}
        out = subprocess.run([sys.executable, "-c", ARENAS, mode], capture_output=True, text=True, check=True,
                             env={**clean, **env}).stdout.split()
        return out[0], int(out[1])

    assert arenas("cap") == ("2", 2)
    assert arenas("free")[1] > 2  # glibc's own limit is 8 per core
    # the environment's setting wins
    assert arenas("cap", MALLOC_ARENA_MAX="4") == ("None", 4)
    assert arenas("cap", GLIBC_TUNABLES="glibc.malloc.arena_max=3") == ("None", 3)
