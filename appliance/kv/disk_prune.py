"""Old identity directories of the prefix cache's disk tier.

Each model identity (GGUF file version, KV types, K centring, llama.cpp build) has its own
directory under the tier's path, so a new model file, KV type or build starts an empty one and
the old ones are never read again. A directory's modification time is its last use: entries
written or deleted change it, and a store touches it when it opens and closes. When a store
opens, the sibling directories unused for longer than `kv_cache.disk.prune_after_days` are
deleted, so that an appliance's updates do not fill its disk with caches nothing reads (one
appliance per cache directory: another process's open store is not seen here).
"""

from __future__ import annotations

import collections
import logging
import os
import re
import shutil
import threading
import time
from pathlib import Path

log = logging.getLogger("eie.prefix")

IDENTITY_DIR = re.compile(r"[0-9a-f]{32}")  # engine/prefix.py model_identity, hex

# identity directories with an open store in this process (names on one file and KV types share one)
_open: collections.Counter[Path] = collections.Counter()
_lock = threading.Lock()


def touch(directory: Path) -> None:
    try:
        os.utime(directory)
    except OSError:
        pass  # a read-only or vanished directory: the store reports its own disk errors


def opened(directory: Path) -> None:
    touch(directory)
    with _lock:
        _open[directory.resolve()] += 1


def closed(directory: Path) -> None:
    touch(directory)
    with _lock:
        key = directory.resolve()
        _open[key] -= 1
        if _open[key] <= 0:
            del _open[key]


def prune_stale(root: Path, max_age_s: float) -> None:
    """Delete the identity directories under `root` unused for `max_age_s` and not open here
    (each logged with the bytes it held). Other files and directories are left alone."""
    cutoff = time.time() - max_age_s
    try:
        children = list(root.iterdir())
    except OSError:
        return
    for child in children:
        try:
            if not IDENTITY_DIR.fullmatch(child.name) or not child.is_dir() or child.is_symlink():
                continue
            if child.stat().st_mtime >= cutoff:
                continue
            with _lock:
                if _open[child.resolve()] > 0:
                    continue
            size = sum(f.stat().st_size for f in child.iterdir() if f.is_file())
        except OSError:
            continue
        shutil.rmtree(child, ignore_errors=True)
        if not child.exists():
            log.info("prefix cache: deleted %s (%d bytes), unused for over %.0f days", child, size,
                     max_age_s / 86400)
