"""The hash-chained audit trail: one JSON line per request and admin action, each carrying the
hash of the record before it, so an edited, removed or reordered record breaks the chain.

Record: {"seq": n, "ts": ..., "prev": <hash of record n-1>, ...fields..., "hash": sha256(prev + body)}
where body is the record without "hash" as canonical JSON (sorted keys, no spaces). Records are
written by one background thread in the order they were handed in; each line goes out in one
write() on an O_APPEND file, so a killed process leaves whole lines. Past `max_bytes` the file
rotates to <path>.1 (older ones shift up); the first record of the new file carries the hash
of the last one of the old file, so the chain runs across files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("eie.audit")

GENESIS = "0" * 64


def canonical(record: dict[str, Any]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def record_hash(record: dict[str, Any]) -> str:
    body = {k: v for k, v in record.items() if k != "hash"}
    return hashlib.sha256(record.get("prev", "").encode("ascii") + canonical(body)).hexdigest()


def chain_files(path: Path) -> list[Path]:
    """The trail's files, oldest first: <path>.N ... <path>.1, <path>."""
    rotated = []
    n = 1
    while (path.parent / f"{path.name}.{n}").exists():
        rotated.append(path.parent / f"{path.name}.{n}")
        n += 1
    files = list(reversed(rotated))
    if path.exists():
        files.append(path)
    return files


_HEX64 = re.compile(r"[0-9a-f]{64}")


def valid_record(rec: Any) -> bool:
    """Whether a decoded line has a record's chain fields, of their types (a line edited to
    another shape is no record: verify reports it, and a new chain does not link to it)."""
    return (isinstance(rec, dict) and type(rec.get("seq")) is int and rec["seq"] >= 0
            and isinstance(rec.get("prev"), str) and _HEX64.fullmatch(rec["prev"]) is not None
            and isinstance(rec.get("hash"), str) and _HEX64.fullmatch(rec["hash"]) is not None)


def _last_record(path: Path) -> dict[str, Any] | None:
    """The last whole, valid record of a file (a torn last line, or one that is no record, is
    passed over)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - (1 << 20)))
            lines = f.read().split(b"\n")
    except OSError:
        return None
    for line in reversed(lines):
        if line.strip():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if valid_record(rec):
                return rec
            log.warning("audit trail %s: a last line that is no audit record, passed over: %.80r", path, line)
    return None


def _trim_torn_tail(path: Path) -> None:
    """Drop a last line that has no newline (a write cut off by power loss)."""
    try:
        with open(path, "rb+") as f:
            data = f.read()
            if data and not data.endswith(b"\n"):
                cut = data.rfind(b"\n") + 1
                f.truncate(cut)
                log.warning("audit trail %s: dropped a torn last line of %d bytes", path, len(data) - cut)
    except FileNotFoundError:
        pass


class AuditTrail:
    def __init__(self, path: Path, max_bytes: int = 64 << 20, keep: int = 10, include_content: bool = False):
        self.path = path
        self.max_bytes = max_bytes
        self.keep = keep
        self.include_content = include_content
        path.parent.mkdir(parents=True, exist_ok=True)
        _trim_torn_tail(path)
        last = None
        for f in reversed(chain_files(path)):
            last = _last_record(f)
            if last is not None:
                break
        self._seq = (last["seq"] + 1) if last else 0
        self._prev = last["hash"] if last else GENESIS
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        self._size = os.fstat(self._fd).st_size
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="audit-writer", daemon=True)
        self._thread.start()
        self.errors = 0

    def record(self, kind: str, **fields: Any) -> None:
        """Queue one record (never blocks on the disk)."""
        self._queue.put({"kind": kind, **fields})

    def flush(self, timeout: float = 10) -> None:
        done = threading.Event()
        self._queue.put({"_flush": done})
        done.wait(timeout)

    def close(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(timeout=30)
        try:
            os.fsync(self._fd)
            os.close(self._fd)
        except OSError:
            pass

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if "_flush" in item:
                try:
                    os.fsync(self._fd)
                except OSError:
                    pass
                item["_flush"].set()
                continue
            try:
                self._write(item)
            except OSError as e:  # the service keeps running; the gap shows as an error count
                self.errors += 1
                log.error("audit trail write failed: %s", e)
            except Exception:  # (never the writer's end: every later record would be lost unseen)
                self.errors += 1
                log.exception("audit trail write failed")

    def _write(self, fields: dict[str, Any]) -> None:
        rec = {"seq": self._seq, "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "prev": self._prev,
               **fields}
        rec["hash"] = record_hash(rec)
        line = canonical(rec) + b"\n"
        if self._size and self._size + len(line) > self.max_bytes:
            self._rotate()
        os.write(self._fd, line)
        self._size += len(line)
        self._seq += 1
        self._prev = rec["hash"]

    def _rotate(self) -> None:
        os.fsync(self._fd)
        os.close(self._fd)
        rotated = chain_files(self.path)[:-1]  # .N .. .1
        for i in range(len(rotated), 0, -1):
            src = self.path.parent / f"{self.path.name}.{i}"
            if i + 1 > self.keep:
                src.unlink()
            else:
                src.rename(self.path.parent / f"{self.path.name}.{i + 1}")
        self.path.rename(self.path.parent / f"{self.path.name}.1")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o640)
        self._size = 0


@dataclass
class Verdict:
    records: int = 0
    files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def verify(path: Path) -> Verdict:
    """Check the chain of a trail file and its rotated predecessors; each problem names file and line."""
    verdict = Verdict()
    # A rotated file (<path>.N) is checked alone; the live file with the rotated ones before it.
    if path.is_dir():
        verdict.problems.append(f"{path}: a directory, not an audit trail file")
        return verdict
    files = [path] if path.suffix[1:].isdigit() and path.exists() else chain_files(path)
    if not files:
        verdict.problems.append(f"{path}: no such file")
        return verdict
    prev_hash: str | None = None
    prev_seq: int | None = None
    for f in files:
        verdict.files.append(str(f))
        with open(f, "rb") as fh:
            lines = fh.read().split(b"\n")
        torn = lines[-1] != b""
        for lineno, raw in enumerate(lines, 1):
            if not raw:
                continue
            where = f"{f}:{lineno}"
            try:
                rec = json.loads(raw)
                if not valid_record(rec):
                    raise ValueError("no record")
                seq, prev, h = rec["seq"], rec["prev"], rec["hash"]
            except ValueError:
                if torn and lineno == len(lines):
                    verdict.notes.append(f"{where}: torn last line (an interrupted write), ignored")
                else:
                    verdict.problems.append(f"{where}: not a valid audit record")
                continue
            verdict.records += 1
            if record_hash(rec) != h:
                verdict.problems.append(f"{where}: record seq {seq} was edited (its hash does not match its content)")
            if prev_seq is None:
                if seq != 0 or prev != GENESIS:
                    verdict.notes.append(f"{where}: the chain starts at seq {seq} (older records rotated away)")
            else:
                if seq != prev_seq + 1:
                    if seq > prev_seq + 1:
                        verdict.problems.append(f"{where}: seq {seq} follows seq {prev_seq}: "
                                                f"{seq - prev_seq - 1} record(s) removed before this line")
                    else:
                        verdict.problems.append(f"{where}: seq {seq} follows seq {prev_seq}: records reordered")
                elif prev != prev_hash:
                    verdict.problems.append(f"{where}: seq {seq} does not chain to the record before it "
                                            "(that record was replaced)")
            prev_hash, prev_seq = h, seq
    return verdict
