"""An n-gram index over recent outputs of one model, for workloads that repeat across requests.

Bounded (`max_tokens` tokens, oldest outputs dropped first) and persisted next to the prefix
cache's disk tier, in a file named after the GGUF's content hash, so it is scoped per model and
survives restarts. Written atomically (temp file, fsync, rename); an unreadable file is ignored.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
from pathlib import Path

import numpy as np

from .ngram import NGRAM_SIZES, NgramMaps, add_ngrams, longest_match, new_maps

log = logging.getLogger("eie.speculative")
_MAGIC = b"EIEHIST1"


class HistoryIndex:
    def __init__(self, path: Path | None, max_tokens: int = 65536, sizes: tuple[int, ...] = NGRAM_SIZES,
                 save_every: int = 8):
        self.path = path
        self.max_tokens = max_tokens
        self.sizes = tuple(sorted(sizes, reverse=True))
        self._save_every = save_every
        self._outputs: collections.deque[list[int]] = collections.deque()
        self._n_tokens = 0
        self._flat: list[int] = []  # outputs joined, -1 between them
        self._maps: NgramMaps = {}
        self._dirty = 0
        self._lock = threading.Lock()
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
            self.save()

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the longest match of the suffix of `tokens` in the history."""
        return self.lookup_match(tokens, k)[0]

    def lookup_match(self, tokens: list[int], k: int) -> tuple[list[int], int]:
        """The draft (as `lookup`) and the length of the n-gram it matched (0: none)."""
        hit = longest_match(self._maps, tokens)
        if hit is None or k <= 0:
            return [], 0
        out = self._flat[hit[0] : hit[0] + k]
        return (out[: out.index(-1)] if -1 in out else out), hit[1]

    def _rebuild(self) -> None:
        self._flat = []
        self._maps = new_maps(self.sizes)
        for output in self._outputs:
            self._index(output)

    def _index(self, output: list[int]) -> None:
        base = len(self._flat)
        self._flat.extend(output)
        self._flat.append(-1)
        add_ngrams(self._maps, output, 0, len(output) - 1, base)  # each followed by a token of the output

    # ---- persistence -----------------------------------------------------------------------

    def save(self) -> None:
        if self.path is None or not self._dirty:
            return
        self._dirty = 0
        data = np.array([t for o in self._outputs for t in (*o, -1)], dtype=np.int32)
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
