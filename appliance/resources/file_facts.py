"""Facts derived from a file (its content hash, its GGUF dimensions), kept in the cache directory
so that a restart does not read large model files again.

An entry is keyed by the file's path, inode, size, modification time and change time: ctime
moves with any write to the file and cannot be set back by a user, so a file replaced in place
never matches an old entry. Entries are small JSON files written atomically; an unreadable entry
is a miss. Everything here is a cache: failures to write are logged and ignored.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger("eie.cache")

# The kinds of fact, one directory each under the cache directory; a kind's name changes with its
# layout, so that an entry of an older layout is never read as a newer one.
FILE_SHA256 = "file-sha256"
GGUF_SHAPE = "gguf-shape-3"  # -2: with the tied output matrix (resources/repack.py); -3: the layer table
K_CENTERS = "k-centers"
EXACT_VERIFY_ROWS = "exact-verify-rows"
KINDS = (FILE_SHA256, GGUF_SHAPE, K_CENTERS, EXACT_VERIFY_ROWS)


def stat_key(path: Path) -> tuple:
    st = path.stat()
    return (str(path.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _entry(cache_dir: Path, kind: str, key: tuple) -> Path:
    return cache_dir / kind / (hashlib.blake2b(repr(key).encode(), digest_size=16).hexdigest() + ".json")


def load(cache_dir: Path | None, kind: str, key: tuple) -> Any | None:
    if cache_dir is None:
        return None
    try:
        return json.loads(_entry(cache_dir, kind, key).read_text())
    except (OSError, ValueError):
        return None


def save(cache_dir: Path | None, kind: str, key: tuple, value: Any) -> None:
    if cache_dir is None:
        return
    file = _entry(cache_dir, kind, key)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(value))
        os.replace(tmp, file)
    except OSError as e:
        log.warning("%s not cached in %s: %s", kind, file.parent, e)
