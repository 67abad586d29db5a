"""An n-gram index over recent outputs of one model, for workloads that repeat across requests.

Two lookups: the most recent occurrence of the longest suffix match (`lookup_at`), and the
aligned one (`lookup_aligned`): the nearest occurrence after a cursor, a position in one
earlier output that the sequence has been following. Structured answers (JSON, forms, code)
repeat their skeleton with other values: after a value the skeleton's next piece follows the
cursor, while the most recent occurrence of, say, `",\n  "` is some other key.

`lookup_at`'s draft stops where the earlier occurrences of the match (up to `CONSENSUS`) stop
agreeing with the most recent one: after `"sender_name": "` each earlier answer has another
name, and a draft of the last one's name is a wasted verification. The skeleton, which they
share, is drafted in full. SmolLM2's JSON answers replayed with bench/speculative_replay.py
(12 documents, history carried from answer to answer): the second to sixth went from 1.40×,
1.66×, 1.48×, 1.24×, 2.55× to 1.43×, 1.70×, 1.69×, 1.26×, 2.83×, the mean of the eleven warm
ones from 1.92× to 2.01×; rewrite and story answers unchanged.

Tried and left out: also stopping a draft before a token its output had copied from its own
prompt and the asking sequence lacks (another document's values where there is only one
earlier answer, so nothing to disagree with). It helped that second answer (1.43× → 1.48×) and
not the mean (2.01× → 1.99×).

Bounded (`max_tokens` tokens, oldest outputs dropped first) and persisted next to the prefix
cache's disk tier, in a file named after the GGUF's content hash, so it is scoped per model and
survives restarts. Written atomically (temp file, fsync, rename); an unreadable file is ignored.
"""

from __future__ import annotations

import bisect
import collections
import logging
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from .ngram import match_length


log = logging.getLogger("eie.speculative")
_MAGIC = b"EIEHIST1"
ALIGN_WINDOW = 64  # how far after the cursor an aligned match may lie (tokens)
# Not down to single tokens as in the prompt: over tens of thousands of earlier tokens a 1-gram
# matches anywhere and says little about what follows.
HISTORY_NGRAM_SIZES = (5, 4, 3, 2)
CONSENSUS = 4  # earlier occurrences a draft must agree with, where there are any


class HistoryIndex:
    def __init__(self, path: Path | None, max_tokens: int = 65536, sizes: tuple[int, ...] = HISTORY_NGRAM_SIZES,
                 save_every: int = 8):
        self.path = path
        self.max_tokens = max_tokens
        self.sizes = tuple(sorted(sizes, reverse=True))
        self._save_every = save_every
        self._outputs: collections.deque[list[int]] = collections.deque()
        self._n_tokens = 0
        self._flat: list[int] = []  # outputs joined, -1 between them
        # n -> n-gram -> every position that followed it, ascending (the last: the most recent)
        self._all: dict[int, dict[tuple[int, ...], list[int]]] = {}
        self._ends: list[int] = []  # where each output's -1 separator is in _flat
        self.generation = 0  # changes whenever positions in _flat do (cursors of older ones are void)
        self._dirty = 0
        self._lock = threading.Lock()  # one write of the file at a time
        self._writer: threading.Thread | None = None
        if path is not None:
            self._load()
        self._rebuild()

    @property
    def n_tokens(self) -> int:
        return self._n_tokens

    def add(self, output: list[int]) -> None:
        """Remember a finished request's output tokens."""
        if len(output) < 2:
            return
        output = list(output[-self.max_tokens :])
        self._outputs.append(output)
        self._n_tokens += len(output)
        if self._n_tokens > self.max_tokens:
            while self._n_tokens > self.max_tokens * 3 // 4:
                self._n_tokens -= len(self._outputs.popleft())
            self._rebuild()
        else:
            self._index(output)
        self._dirty += 1
        if self._dirty >= self._save_every:
            self.save_soon()

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the longest match of the suffix of `tokens` in the history."""
        return self.lookup_match(tokens, k)[0]

    def lookup_match(self, tokens: list[int], k: int) -> tuple[list[int], int]:
        """The draft (as `lookup`) and the length of the match it continues (0: none)."""
        return self.lookup_at(tokens, k)[:2]

    def lookup_at(self, tokens: list[int], k: int) -> tuple[list[int], int, int]:
        """(draft, match length, where the draft starts in the history) for the most recent
        occurrence of the longest suffix n-gram (its length followed backwards, `match_length`),
        the draft cut where earlier occurrences disagree (it may be empty then); ([], 0, -1) when
        there is no match."""
        if k > 0:
            for n, where in self._occurrences(tokens):
                at = where[-1]
                return self._agreed(where, self._draft(at, k)), match_length(self._flat, at, tokens, n), at
        return [], 0, -1

    def _agreed(self, where: list[int], draft: list[int]) -> list[int]:
        """The part of `draft` (from where[-1]) that the CONSENSUS occurrences before it continue
        with too."""
        flat = self._flat
        for t, token in enumerate(draft):
            for q in where[-1 - CONSENSUS : -1]:
                if q + t >= len(flat) or flat[q + t] != token:
                    return draft[:t]
        return draft

    def lookup_aligned(self, tokens: list[int], k: int, cursor: int) -> tuple[list[int], int, int]:
        """As `lookup_at`, but the nearest occurrence after `cursor` (a position `lookup_at` or this
        returned, of this `generation`, for a shorter sequence), in the same output and within
        ALIGN_WINDOW."""
        if k <= 0 or not 0 <= cursor < len(self._flat):
            return [], 0, -1
        end = self._ends[bisect.bisect_left(self._ends, cursor)]  # the cursor's output ends here
        for n, where in self._occurrences(tokens):
            i = bisect.bisect_right(where, cursor)
            if i < len(where) and where[i] < end and where[i] - cursor <= ALIGN_WINDOW:
                return self._draft(where[i], k), match_length(self._flat, where[i], tokens, n), where[i]
        return [], 0, -1

    def _occurrences(self, tokens: list[int]) -> Iterator[tuple[int, list[int]]]:
        """(n, positions) for each indexed suffix n-gram of `tokens`, the longest first."""
        for n, table in self._all.items():
            if len(tokens) >= n:
                where = table.get(tuple(tokens[-n:]))
                if where:
                    yield n, where

    def _draft(self, at: int, k: int) -> list[int]:
        out = self._flat[at : at + k]
        return out[: out.index(-1)] if -1 in out else out

    def _rebuild(self) -> None:
        self._flat = []
        self._ends = []
        self._all = {n: {} for n in self.sizes}
        self.generation += 1
        for output in self._outputs:
            self._index(output)

    def _index(self, output: list[int]) -> None:
        base = len(self._flat)
        self._flat.extend(output)
        self._ends.append(len(self._flat))
        self._flat.append(-1)
        for i in range(len(output) - 1):  # n-grams followed by a token of the output
            for n, table in self._all.items():
                if i + 1 >= n:
                    table.setdefault(tuple(output[i + 1 - n : i + 1]), []).append(base + i + 1)

    # ---- persistence -----------------------------------------------------------------------

    def save_soon(self) -> None:
        """Write the file from a thread of its own: `add` runs on the runner thread between two
        decodes, and the other sequences' next step would wait for the disk (1.6 ms with 17k
        tokens, 3.8 ms with 60k, most of it the fsync)."""
        if self.path is None or not self._dirty:
            return
        self._dirty = 0
        outputs = list(self._outputs)  # the outputs themselves are never changed after `add`
        if self._writer is not None:
            self._writer.join()  # (long done, 8 requests ago) so the file never goes back to older outputs
        self._writer = threading.Thread(target=self._write, args=(outputs,), name="eie-history-save", daemon=True)
        self._writer.start()

    def save(self) -> None:
        """Write the file now: `save_soon`, then wait for the write in flight."""
        self.save_soon()
        if self._writer is not None:
            self._writer.join()

    def _write(self, outputs: list[list[int]]) -> None:
        sep = np.array([-1], dtype=np.int32)
        data = np.concatenate([a for o in outputs for a in (np.asarray(o, dtype=np.int32), sep)] or [sep[:0]])
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                tmp = self.path.with_name(self.path.name + ".tmp")
                with open(tmp, "wb") as f:
                    f.write(_MAGIC)
                    f.write(data.tobytes())
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
            except OSError as e:  # the history is an optimisation: keep serving
                log.warning("speculative history: cannot save %s: %s", self.path, e)

    def _load(self) -> None:
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as e:
            log.warning("speculative history: cannot read %s: %s", self.path, e)
            return
        if not raw.startswith(_MAGIC) or (len(raw) - len(_MAGIC)) % 4:
            log.warning("speculative history: %s is not a history file; starting empty", self.path)
            return
        data = np.frombuffer(raw[len(_MAGIC) :], dtype=np.int32).tolist()
        current: list[int] = []
        for t in data:
            if t == -1:
                if current:
                    self._outputs.append(current)
                    self._n_tokens += len(current)
                current = []
            else:
                current.append(t)
        while self._n_tokens > self.max_tokens and self._outputs:
            self._n_tokens -= len(self._outputs.popleft())
