"""Saved prefix states in two tiers: RAM and a disk directory that survives restarts.

Keys are chained block hashes: the prompt is cut into blocks of `block` tokens and block i's
key is hash(key of block i-1, its tokens), starting from the model identity (the GGUF file's
content hash, the KV types and the llama.cpp build), so a key can never name another model's or
another format's state. An entry holds the state of the first n blocks of some prompt and
answers for each of its n keys (a shorter match restores it and drops the cells past it).

Disk entries are files `<key>.kv` in `<dir>/<identity>/`: a header (magic, JSON with the key,
identity, token count, codec and the payload's SHA-256) and the payload. They are written off
the request path by a writer thread, atomically (temp file, fsync, rename, fsync of the
directory); the index is rebuilt from the directory at start. An entry that is truncated,
corrupt, foreign (another identity or key) or unreadable is deleted and counts as a miss. Disk
full, a read-only directory or an I/O error turns the disk tier off with a warning; nothing
fails because of the cache.
"""

from __future__ import annotations

import collections
import errno
import hashlib
import logging
import os
import queue
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import msgspec

from . import disk_prune

log = logging.getLogger("eie.prefix")

MAGIC = b"EIEKVST1"
_HEADER_LEN = struct.Struct("<I")


class _Header(msgspec.Struct):
    """A disk entry's JSON header; a file whose header has another shape is corrupt."""

    key: str
    identity: str
    keys: list[str]
    codec: str
    payload_bytes: int
    sha256: str


_header_decoder = msgspec.json.Decoder(_Header)


def block_keys(identity: bytes, tokens: list[int], block: int) -> list[bytes]:
    """The chained key of every full block of `tokens`."""
    keys = []
    parent = identity
    for start in range(0, len(tokens) - block + 1, block):
        chunk = struct.pack(f"<{block}i", *tokens[start : start + block])
        parent = hashlib.blake2b(parent + chunk, digest_size=16).digest()
        keys.append(parent)
    return keys


@dataclass
class _Entry:
    key: bytes  # the key of its last block
    n_blocks: int
    keys: list[bytes]
    size: int  # payload bytes in the tier that holds it


@dataclass
class Hit:
    n_blocks: int
    state: bytes
    tier: str  # "ram" | "disk"
    key: bytes = b""  # the entry's key (discard)


class PrefixStore:
    """One model's saved prefixes. Thread-safe; disk writes happen on its own thread.

    `encode`/`decode` turn a state into its stored form and back (e.g. TurboQuant compression
    for f16/q8_0 states); identity by default. `wait_quiet(max_seconds)`, when given, blocks
    while the box is busy decoding (True once it is quiet); the writer calls it before each disk
    write (encode, hash, write). A write waits at most `max_defer_s` from when it was queued,
    and no longer once the queued states hold more than the RAM tier's size.
    """

    def __init__(
        self,
        identity: bytes,
        *,
        block: int,
        ram_bytes: int,
        disk_dir: Path | None,
        disk_bytes: int,
        encode: Callable[[bytes], bytes] | None = None,
        decode: Callable[[bytes], bytes] | None = None,
        codec: str = "raw",
        wait_quiet: Callable[[float], bool] | None = None,
        max_defer_s: float = 5.0,
        prune_after_s: float = 0.0,
    ):
        self.identity = identity
        self.block = block
        self.ram_bytes = ram_bytes
        self.disk_bytes = disk_bytes
        self.codec = codec
        self._encode = encode or (lambda b: b)
        self._decode = decode or (lambda b: b)
        self._wait_quiet = wait_quiet
        self.max_defer_s = max_defer_s
        self.prune_after_s = prune_after_s  # sibling identity directories unused this long are deleted
        self._queued_bytes = 0  # states waiting for the writer
        self._lock = threading.RLock()
        self._ram: collections.OrderedDict[bytes, tuple[_Entry, bytes]] = collections.OrderedDict()
        self._ram_used = 0
        self._disk: collections.OrderedDict[bytes, _Entry] = collections.OrderedDict()  # LRU order
        self._disk_used = 0
        self._index: dict[bytes, tuple[bytes, int]] = {}  # block key → (entry key, blocks)
        self.stats = collections.Counter()
        self.disk_error: str | None = None
        self.dir = disk_dir / identity.hex() if disk_dir else None
        self._dir_open = False  # counted open in disk_prune (until close)
        self._queue: queue.Queue = queue.Queue()
        self._generation = 0  # bumped by flush(): queued writes of an older generation are dropped
        self._writer: threading.Thread | None = None
        if self.dir is not None:
            self._open_disk()

    # ---- lookups -----------------------------------------------------------------------------

    def lookup(self, keys: list[bytes]) -> Hit | None:
        """The longest saved prefix among `keys` (block keys of a prompt), with its state: an entry
        that ends there when there is one (nothing to cut off, and a smaller state), else a longer
        entry through it."""
        with self._lock:
            for i in range(len(keys) - 1, -1, -1):
                ref = self._index.get(keys[i])
                # the entry that ends here (if any: _load finds nothing otherwise), then the indexed one
                for entry_key in dict.fromkeys(k for k in (keys[i], ref[0] if ref else None) if k is not None):
                    got = self._load(entry_key)
                    if got is None:  # it was bad and is gone (or never reached the disk): try another
                        if ref and ref[0] == entry_key and entry_key not in self._ram and entry_key not in self._disk:
                            self._index.pop(keys[i], None)
                        continue
                    state, tier = got
                    self.stats[f"hits_{tier}"] += 1
                    return Hit(i + 1, state, tier, entry_key)
            self.stats["misses"] += 1
            return None

    def _load(self, entry_key: bytes) -> tuple[bytes, str] | None:
        if entry_key in self._ram:
            self._ram.move_to_end(entry_key)
            return self._ram[entry_key][1], "ram"
        entry = self._disk.get(entry_key)
        if entry is None or self.dir is None:
            return None
        path = self.dir / f"{entry_key.hex()}.kv"
        try:
            raw = path.read_bytes()
        except OSError as e:
            self._reject(entry, f"unreadable: {e}")
            return None
        problem, payload = self._verify(raw, entry_key)
        if problem:
            self._reject(entry, problem)
            return None
        try:
            state = self._decode(payload)
        except Exception as e:  # a payload that passes the checksum but does not decode
            self._reject(entry, f"does not decode: {e}")
            return None
        self._disk.move_to_end(entry_key)
        try:
            os.utime(path)
        except OSError:
            pass
        self._ram_put(entry, state)  # promote
        return state, "disk"

    def _verify(self, raw: bytes, entry_key: bytes) -> tuple[str | None, bytes]:
        if len(raw) < len(MAGIC) + _HEADER_LEN.size or not raw.startswith(MAGIC):
            return "not an EIE KV entry", b""
        (hlen,) = _HEADER_LEN.unpack_from(raw, len(MAGIC))
        start = len(MAGIC) + _HEADER_LEN.size
        try:
            header = _header_decoder.decode(raw[start : start + hlen])
        except ValueError:  # not JSON, or JSON of another shape
            return "header is corrupt", b""
        payload = raw[start + hlen :]
        if header.identity != self.identity.hex():
            return "written for another model identity", b""
        if header.key != entry_key.hex():
            return "its key does not match its name", b""
        if header.payload_bytes != len(payload):
            return "truncated", b""
        if header.sha256 != hashlib.sha256(payload).hexdigest():
            return "checksum mismatch", b""
        return None, payload

    def _reject(self, entry: _Entry, why: str) -> None:
        log.warning("prefix cache: deleting disk entry %s: %s", entry.key.hex(), why)
        self.stats["corrupt_deleted"] += 1
        self._drop_disk(entry)

    # ---- saving ------------------------------------------------------------------------------

    def put(self, keys: list[bytes], state: bytes) -> None:
        """Save the state of the prefix whose block keys are `keys` (RAM now, disk soon)."""
        if not keys:
            return
        entry = _Entry(keys[-1], len(keys), list(keys), len(state))
        with self._lock:
            if entry.key in self._ram or entry.key in self._disk:
                return
            self._ram_put(entry, state)
            self.stats["saved"] += 1
            generation = self._generation
            queue_it = self.dir is not None and self.disk_error is None
            if queue_it:
                self._queued_bytes += len(state)
        if queue_it:
            self._queue.put((generation, entry, state, time.monotonic()))

    @property
    def ram_used(self) -> int:
        return self._ram_used

    def contains(self, keys: list[bytes]) -> bool:
        with self._lock:
            return bool(keys) and keys[-1] in self._index

    def _ram_put(self, entry: _Entry, state: bytes) -> None:
        if len(state) > self.ram_bytes:
            self._register(entry)
            return
        self._ram[entry.key] = (_Entry(entry.key, entry.n_blocks, entry.keys, len(state)), state)
        self._ram_used += len(state)
        self._register(entry)
        while self._ram_used > self.ram_bytes and self._ram:
            old_key, (old, data) = self._ram.popitem(last=False)
            self._ram_used -= len(data)
            self.stats["ram_evictions"] += 1
            if old_key not in self._disk:
                pending = self.dir is not None and self.disk_error is None
                if not pending:
                    self._unregister(old)

    def _register(self, entry: _Entry) -> None:
        for i, k in enumerate(entry.keys):
            cur = self._index.get(k)
            if cur is None or cur[1] < entry.n_blocks:
                self._index[k] = (entry.key, i + 1)

    def _unregister(self, entry: _Entry) -> None:
        for k in entry.keys:
            if self._index.get(k, (None,))[0] == entry.key:
                del self._index[k]

    def shrink_ram(self, target_bytes: int) -> int:
        """Drop RAM entries (least recently used first) until at most `target_bytes` remain;
        entries on disk stay available there. Returns the bytes freed."""
        freed = 0
        with self._lock:
            while self._ram_used > target_bytes and self._ram:
                key, (entry, data) = self._ram.popitem(last=False)
                self._ram_used -= len(data)
                freed += len(data)
                self.stats["ram_spills"] += 1
                if key not in self._disk and (self.dir is None or self.disk_error is not None):
                    self._unregister(entry)
        return freed

    # ---- disk --------------------------------------------------------------------------------

    def _open_disk(self) -> None:
        assert self.dir is not None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            disk_prune.opened(self.dir)
            self._dir_open = True
            if self.prune_after_s > 0:
                disk_prune.prune_stale(self.dir.parent, self.prune_after_s)
            self._scan()
        except OSError as e:
            self._disable(e)
            return
        self._writer = threading.Thread(target=self._write_loop, name="prefix-writer", daemon=True)
        self._writer.start()

    def _scan(self) -> None:
        """Rebuild the disk index from the directory (oldest first, by modification time)."""
        assert self.dir is not None
        files = []
        for path in self.dir.glob("*.kv"):
            try:
                files.append((path.stat().st_mtime_ns, path))
            except OSError:
                continue
        for tmp in self.dir.glob("*.tmp"):  # a write interrupted by a crash
            tmp.unlink(missing_ok=True)
        for _, path in sorted(files):
            try:
                entry = self._read_header(path)
            except (OSError, ValueError) as e:
                log.warning("prefix cache: deleting %s: %s", path.name, e)
                self.stats["corrupt_deleted"] += 1
                path.unlink(missing_ok=True)
                continue
            self._disk[entry.key] = entry
            self._disk_used += entry.size
            self._register(entry)
        self._trim_disk()

    def _read_header(self, path: Path) -> _Entry:
        with open(path, "rb") as f:
            head = f.read(len(MAGIC) + _HEADER_LEN.size)
            if len(head) < len(MAGIC) + _HEADER_LEN.size or not head.startswith(MAGIC):
                raise ValueError("not an EIE KV entry")
            (hlen,) = _HEADER_LEN.unpack_from(head, len(MAGIC))
            header = _header_decoder.decode(f.read(hlen))  # a ValueError where it is not a header
        if header.identity != self.identity.hex():
            raise ValueError("written for another model identity")
        key = bytes.fromhex(header.key)
        if path.stem != key.hex():
            raise ValueError("its key does not match its name")
        keys = [bytes.fromhex(k) for k in header.keys]
        if not keys or keys[-1] != key:
            raise ValueError("inconsistent block keys")
        return _Entry(key, len(keys), keys, path.stat().st_size)

    def _write_loop(self) -> None:
        try:  # the disk tier is background work: let decoding threads have the cores first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        except (AttributeError, OSError):
            pass
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                generation, entry, state, queued_at = item
                if self._wait_quiet is not None:
                    self._wait_until_quiet(generation, queued_at + self.max_defer_s)
                if self.disk_error is None and generation == self._generation:
                    self._write(entry, state, generation)
            finally:
                if item is not None:
                    with self._lock:
                        self._queued_bytes -= len(item[2])
                self._queue.task_done()

    def _wait_until_quiet(self, generation: int, deadline: float) -> None:
        """Wait (in short slices) for a quiet box, until the deadline, a flush, or the queue
        holding more than the RAM tier's size."""
        while generation == self._generation and self._queued_bytes <= self.ram_bytes:
            left = deadline - time.monotonic()
            if left <= 0 or self._wait_quiet(min(left, 0.25)):
                return

    def _write(self, entry: _Entry, state: bytes, generation: int) -> None:
        assert self.dir is not None
        try:
            payload = self._encode(state)
        except Exception as e:
            log.warning("prefix cache: could not encode an entry (%s); storing it raw", e)
            payload = state
        header = msgspec.json.encode(_Header(
            entry.key.hex(), self.identity.hex(), [k.hex() for k in entry.keys],
            self.codec if payload is not state else "raw", len(payload), hashlib.sha256(payload).hexdigest()))
        data = MAGIC + _HEADER_LEN.pack(len(header)) + header + payload
        if len(data) > self.disk_bytes:  # it would be written, synced and deleted at once
            self.stats["disk_too_large"] += 1
            return
        final = self.dir / f"{entry.key.hex()}.kv"
        tmp = self.dir / f"{entry.key.hex()}.{threading.get_ident()}.tmp"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
            fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            try:
                tmp.unlink(missing_ok=True)
            except OSError:
                pass
            self._disable(e)
            return
        with self._lock:
            if generation != self._generation:  # flushed while it was being written
                final.unlink(missing_ok=True)
                return
            stored = _Entry(entry.key, entry.n_blocks, entry.keys, len(data))
            self._disk[entry.key] = stored
            self._disk_used += len(data)
            self._register(stored)
            self.stats["disk_writes"] += 1
            self._trim_disk()

    def _trim_disk(self) -> None:
        while self._disk_used > self.disk_bytes and self._disk:
            _, entry = next(iter(self._disk.items()))
            self.stats["disk_evictions"] += 1
            self._drop_disk(entry)

    def _drop_disk(self, entry: _Entry) -> None:
        if self._disk.pop(entry.key, None) is not None:
            self._disk_used -= entry.size
        if entry.key not in self._ram:
            self._unregister(entry)
        if self.dir is not None:
            try:
                (self.dir / f"{entry.key.hex()}.kv").unlink(missing_ok=True)
            except OSError:
                pass

    def _disable(self, e: OSError) -> None:
        kind = {errno.ENOSPC: "disk full", errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                errno.EIO: "I/O error", errno.EDQUOT: "quota exceeded"}.get(e.errno, "error")
        if self.disk_error is None:
            log.warning("prefix cache: disk tier at %s turned off (%s: %s)", self.dir, kind, e)
        self.disk_error = f"{kind}: {e}"
        self.stats["disk_errors"] += 1

    # ---- housekeeping ------------------------------------------------------------------------

    def drain(self, timeout: float | None = None) -> None:
        """Wait until the queued disk writes are done."""
        if self._writer is not None:
            done = threading.Event()
            threading.Thread(target=lambda: (self._queue.join(), done.set()), daemon=True).start()
            done.wait(timeout)

    def close(self) -> None:
        """Finish the queued disk writes and let go of the states held in RAM (the model is
        unloading: whatever still holds the store, a metrics scrape say, must not hold them)."""
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout=30)
            self._writer = None
        if self._dir_open:
            self._dir_open = False
            disk_prune.closed(self.dir)
        with self._lock:
            for key, (entry, _) in self._ram.items():
                if key not in self._disk:
                    self._unregister(entry)
            self._ram.clear()
            self._ram_used = 0

    def discard(self, entry_key: bytes, why: str) -> None:
        """Forget an entry that turned out unusable (its state refused by the context it was
        restored into), in RAM and on disk, so that it answers no more lookups and the prefix's
        own state can be saved in its place."""
        with self._lock:
            held = self._ram.pop(entry_key, None)
            if held is not None:
                self._ram_used -= len(held[1])
            on_disk = self._disk.get(entry_key)
            entry = held[0] if held is not None else on_disk
            if entry is None:
                return
            log.warning("prefix cache: dropping entry %s: %s", entry_key.hex(), why)
            self.stats["discarded"] += 1
            if on_disk is not None:
                self._drop_disk(on_disk)
            self._unregister(entry)

    def flush(self) -> None:
        """Forget every entry, in RAM and on disk (queued writes are dropped)."""
        with self._lock:  # a write in flight sees the new generation and deletes its file
            self._generation += 1
            for entry in list(self._disk.values()):
                self._drop_disk(entry)
            self._ram.clear()
            self._ram_used = 0
            self._index.clear()

    def status(self) -> dict:
        with self._lock:
            hits = {t: self.stats[f"hits_{t}"] for t in ("ram", "disk")}
            lookups = sum(hits.values()) + self.stats["misses"]
            return {
                "block_tokens": self.block,
                "ram": {"entries": len(self._ram), "bytes": self._ram_used, "cap_bytes": self.ram_bytes,
                        "hits": hits["ram"]},
                "disk": {"enabled": self.dir is not None and self.disk_error is None,
                         "path": str(self.dir) if self.dir else None, "error": self.disk_error,
                         "entries": len(self._disk), "bytes": self._disk_used, "cap_bytes": self.disk_bytes,
                         "hits": hits["disk"], "codec": self.codec},
                "lookups": lookups, "misses": self.stats["misses"],
                "hit_rate": (sum(hits.values()) / lookups) if lookups else 0.0,
                "counters": dict(self.stats),
            }
