"""An n-gram index over recent outputs of one model, for workloads that repeat across requests.

Two lookups: the most recent occurrence of the longest suffix match (`lookup_at`), and the
aligned one (`lookup_aligned`): the nearest occurrence after a cursor, a position in one
earlier output that the sequence has been following. Structured answers (JSON, forms, code)
repeat their skeleton with other values: after a value the skeleton's next piece follows the
cursor, while the most recent occurrence of, say, `",\n  "` is some other key.

Two cuts keep the values of other requests out of the drafts, so that only the skeleton is
verified. `lookup_at`'s draft stops where the earlier occurrences of the match (up to
`CONSENSUS`) stop agreeing with the most recent one: after `"sender_name": "` each earlier
answer has another name. And every draft stops at a token that its output had copied from its
own request's prompt (recorded with the output) when the asking sequence has not got that token
anywhere: the name of another document's sender, the first time there is just one earlier answer
to draft from. A repeated request keeps its drafts (its prompt has the same tokens). SmolLM2's
JSON answers replayed with bench/speculative_replay.py, second to sixth answer: 1.42×, 1.54×,
1.52×, 1.22×, 2.52× without the cuts; 1.39×, 1.65×, 1.66×, 1.30×, 2.84× with the first;
1.50×, 1.74×, 1.77×, 1.27×, 2.92× with both. Rewrite and story answers: unchanged.

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
from collections.abc import Collection, Container, Iterator
from pathlib import Path

import numpy as np


log = logging.getLogger("eie.speculative")
_MAGIC = b"EIEHIST2"  # int32 tokens, COPIED set on those copied from the prompt, -1 after each output
_MAGIC_V1 = b"EIEHIST1"  # (no COPIED flags; still read)
COPIED = 1 << 30
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
        # each output with, per token, whether its request's prompt had that token
        self._outputs: collections.deque[tuple[list[int], bytes]] = collections.deque()
        self._n_tokens = 0
        self._flat: list[int] = []  # outputs joined, -1 between them
        self._copied = bytearray()  # per position of _flat: the output's prompt had the token
        # n -> n-gram -> every position that followed it, ascending (the last: the most recent)
        self._all: dict[int, dict[tuple[int, ...], list[int]]] = {}
        self._ends: list[int] = []  # where each output's -1 separator is in _flat
        self.generation = 0  # changes whenever positions in _flat do (cursors of older ones are void)
        self._dirty = 0
        self._lock = threading.Lock()
        if path is not None:
            self._load()
        self._rebuild()

    @property
    def n_tokens(self) -> int:
        return self._n_tokens

    def add(self, output: list[int], prompt: Collection[int] = ()) -> None:
        """Remember a finished request's output tokens, and which of them its prompt had."""
        if len(output) < 2:
            return
        output = list(output[-self.max_tokens :])
        had = prompt if isinstance(prompt, (set, frozenset)) else set(prompt)
        entry = (output, bytes(t in had for t in output))
        self._outputs.append(entry)
        self._n_tokens += len(output)
        if self._n_tokens > self.max_tokens:
            while self._n_tokens > self.max_tokens * 3 // 4:
                self._n_tokens -= len(self._outputs.popleft()[0])
            self._rebuild()
        else:
            self._index(entry)
        self._dirty += 1
        if self._dirty >= self._save_every:
            self.save()

    def lookup(self, tokens: list[int], k: int, seen: Container[int] | None = None) -> list[int]:
        """Up to k tokens that followed the longest match of the suffix of `tokens` in the history."""
        return self.lookup_match(tokens, k, seen)[0]

    def lookup_match(self, tokens: list[int], k: int, seen: Container[int] | None = None) -> tuple[list[int], int]:
        """The draft (as `lookup`) and the length of the n-gram it matched (0: none)."""
        return self.lookup_at(tokens, k, seen)[:2]

    def lookup_at(self, tokens: list[int], k: int, seen: Container[int] | None = None) -> tuple[list[int], int, int]:
        """(draft, n, where the draft starts in the history) for the most recent occurrence of
        the longest suffix match; ([], 0, -1) when there is no match. The draft is cut where
        earlier occurrences disagree and before a token copied from its output's prompt that
        `seen` (the asking sequence's tokens; default `tokens`) lacks: it may be empty."""
        if k > 0:
            for n, where in self._occurrences(tokens):
                at = where[-1]
                draft = self._agreed(where, self._draft(at, k))
                return self._own(at, draft, tokens if seen is None else seen), n, at
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

    def _own(self, at: int, draft: list[int], seen: Container[int]) -> list[int]:
        """`draft` (from position `at`) up to the first token its output copied from its prompt
        that the asking sequence has not got."""
        copied = self._copied
        for t, token in enumerate(draft):
            if copied[at + t] and token not in seen:
                return draft[:t]
        return draft

    def lookup_aligned(self, tokens: list[int], k: int, cursor: int,
                       seen: Container[int] | None = None) -> tuple[list[int], int, int]:
        """As `lookup_at`, but the nearest occurrence after `cursor` (a position `lookup_at` or this
        returned, of this `generation`, for a shorter sequence), in the same output and within
        ALIGN_WINDOW; only the prompt-copy cut applies (the draft follows that one output)."""
        if k <= 0 or not 0 <= cursor < len(self._flat):
            return [], 0, -1
        end = self._ends[bisect.bisect_left(self._ends, cursor)]  # the cursor's output ends here
        for n, where in self._occurrences(tokens):
            i = bisect.bisect_right(where, cursor)
            if i < len(where) and where[i] < end and where[i] - cursor <= ALIGN_WINDOW:
                return self._own(where[i], self._draft(where[i], k), tokens if seen is None else seen), n, where[i]
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
        self._copied = bytearray()
        self._ends = []
        self._all = {n: {} for n in self.sizes}
        self.generation += 1
        for output in self._outputs:
            self._index(output)

    def _index(self, entry: tuple[list[int], bytes]) -> None:
        output, copied = entry
        base = len(self._flat)
        self._flat.extend(output)
        self._copied += copied
        self._ends.append(len(self._flat))
        self._flat.append(-1)
        self._copied.append(0)
        for i in range(len(output) - 1):  # n-grams followed by a token of the output
            for n, table in self._all.items():
                if i + 1 >= n:
                    table.setdefault(tuple(output[i + 1 - n : i + 1]), []).append(base + i + 1)

    # ---- persistence -----------------------------------------------------------------------

    def save(self) -> None:
        if self.path is None or not self._dirty:
            return
        self._dirty = 0
        data = np.array([t for o, copied in self._outputs for t in (*(x | COPIED if c else x for x, c in zip(o, copied)), -1)],
                        dtype=np.int32)
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
        if not raw.startswith((_MAGIC, _MAGIC_V1)) or (len(raw) - len(_MAGIC)) % 4:
            log.warning("speculative history: %s is not a history file; starting empty", self.path)
            return
        data = np.frombuffer(raw[len(_MAGIC) :], dtype=np.int32).tolist()
        current: list[int] = []
        for t in data:
            if t == -1:
                if current:
                    self._outputs.append(([x & ~COPIED for x in current], bytes(x >= COPIED for x in current)))
                    self._n_tokens += len(current)
                current = []
            else:
                current.append(t)
        while self._n_tokens > self.max_tokens and self._outputs:
            self._n_tokens -= len(self._outputs.popleft()[0])
