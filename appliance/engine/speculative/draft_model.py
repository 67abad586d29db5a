"""A smaller model with the target's vocabulary that drafts tokens greedily.

Its KV lives in its own llama_context with the target's sequence ids (one KV stream each).
Before drafting, each sequence's draft KV is brought in line with the target's tokens: cut back
to the common prefix (`llama_memory_seq_rm`) and the missing tokens decoded, all sequences in
one batch; then k − 1 more single-token rounds, again batched over the sequences.
"""

from __future__ import annotations

import threading
from pathlib import Path

import llama_cpp as lc
import numpy as np

from ...resources.cores import CoreBudget
from .. import native
from ..decode import decode_with_cores


class VocabMismatch(ValueError):
    pass


def check_vocab(target: native.Vocab, draft: native.Vocab, what: str) -> None:
    """Raise VocabMismatch (naming `what`) unless both vocabularies map every id to the same piece."""
    if target.n_vocab != draft.n_vocab:
        raise VocabMismatch(f"{what}: the draft model has {draft.n_vocab} tokens, the target {target.n_vocab}; "
                            "a draft model needs the target's vocabulary")
    for t in range(target.n_vocab):
        if target.piece(t, special=True) != draft.piece(t, special=True):
            raise VocabMismatch(f"{what}: token {t} is {draft.piece(t, special=True)!r} in the draft model and "
                                f"{target.piece(t, special=True)!r} in the target; a draft model needs the target's "
                                "vocabulary")
    if (target.bos, target.eos) != (draft.bos, draft.eos):
        raise VocabMismatch(f"{what}: special tokens differ (BOS/EOS {draft.bos}/{draft.eos} in the draft model, "
                            f"{target.bos}/{target.eos} in the target)")


class DraftModel:
    def __init__(self, path: Path, target: native.Vocab, *, what: str, n_seq_max: int, n_ctx_total: int,
                 n_batch: int, threads: int, cores: CoreBudget, cancel: threading.Event | None = None,
                 n_gpu_layers: int = -1):
        try:
            self.loaded = native.load(path, n_ctx_total=n_ctx_total, n_seq_max=n_seq_max, n_batch=n_batch,
                                      n_threads=threads, type_k="f16", type_v="f16", flash_attn="auto",
                                      cancel=cancel, n_outputs_max=n_seq_max, n_gpu_layers=n_gpu_layers)
        except native.LoadError as e:
            raise native.LoadError(f"{what}: {e}") from e
        try:
            check_vocab(target, native.Vocab(self.loaded.vocab, self.loaded.n_vocab), what)
        except BaseException:
            self.loaded.free()
            raise
        self.path = path
        self.cores = cores
        self.threads = threads
        self._threads_set = threads
        self._mem = lc.llama_get_memory(self.loaded.ctx)
        self._cap = n_batch
        self._outputs_cap = n_seq_max  # the context's n_outputs_max: one row per sequence
        self._batch = lc.llama_batch_init(n_batch, 0, 1)
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n_batch,))
        np.ctypeslib.as_array(self._batch.n_seq_id, shape=(n_batch,))[:] = 1
        self._logits = np.ctypeslib.as_array(self._batch.logits, shape=(n_batch,))
        self._seq_ptrs = [self._batch.seq_id[i] for i in range(n_batch)]
        self._cached: dict[int, list[int]] = {}  # seq id -> the tokens in its draft KV
        self.n_vocab = self.loaded.n_vocab

    def free(self) -> None:
        lc.llama_batch_free(self._batch)
        self.loaded.free()

    def forget(self, seq_id: int) -> None:
        """The sequence ended: drop its draft KV."""
        if self._cached.pop(seq_id, None) is not None:
            lc.llama_memory_seq_rm(self._mem, seq_id, -1, -1)

    def draft(self, jobs: list[tuple[int, list[int], int]]) -> list[list[int]]:
        """For each (seq id, the sequence's tokens so far, k): up to k greedy draft tokens."""
        out: list[list[int]] = [[] for _ in jobs]
        pending: list[tuple[int, int, list[int]]] = []  # (job index, seq id, tokens to decode)
        for j, (sid, tokens, k) in enumerate(jobs):
            cached = self._cached.setdefault(sid, [])
            common = _common_prefix(cached, tokens)
            if common == len(tokens):  # never decode nothing: redo the last token for its logits
                common -= 1
            if common < len(cached):
                lc.llama_memory_seq_rm(self._mem, sid, common, -1)
                del cached[common:]
            pending.append((j, sid, tokens[common:]))
        nexts = self._feed(pending)  # job index -> the draft's greedy next token
        for _ in range(max(k for _, _, k in jobs)):
            more: list[tuple[int, int, list[int]]] = []
            for j, tok in nexts.items():
                out[j].append(tok)
                if len(out[j]) < jobs[j][2]:
                    more.append((j, jobs[j][0], [tok]))
            if not more:
                break
            nexts = self._feed(more)
        return out

    def _feed(self, pending: list[tuple[int, int, list[int]]]) -> dict[int, int]:
        """Decode each job's tokens after its cached ones, in as few batches as fit; returns each
        job's greedy next token (read right after the decode that computed its last row)."""
        nexts: dict[int, int] = {}
        rows: list[tuple[int, int]] = []  # (job index, row) of the batch being filled
        n = 0
        for j, sid, toks in pending:
            cached = self._cached[sid]
            i = 0
            while i < len(toks):
                take = min(len(toks) - i, self._cap - n)
                start = len(cached)
                self._tok[n : n + take] = toks[i : i + take]
                self._pos[n : n + take] = np.arange(start, start + take, dtype=np.int32)
                self._logits[n : n + take] = 0
                for r in range(n, n + take):
                    self._seq_ptrs[r][0] = sid
                cached.extend(toks[i : i + take])
                i += take
                n += take
                if i == len(toks):
                    self._logits[n - 1] = 1
                    rows.append((j, n - 1))
                if n == self._cap or len(rows) == self._outputs_cap:
                    self._decode(n)
                    nexts.update((jj, self._argmax(r)) for jj, r in rows)
                    rows, n = [], 0
        if n:
            self._decode(n)
            nexts.update((jj, self._argmax(r)) for jj, r in rows)
        return nexts

    def _decode(self, n_tokens: int) -> None:
        self._batch.n_tokens = n_tokens
        rc, self._threads_set = decode_with_cores(self.loaded.ctx, self._batch, self.cores, self.threads,
                                                  self._threads_set)
        if rc != 0:
            raise RuntimeError(f"draft model: llama_decode returned {rc}")

    def _argmax(self, row: int) -> int:
        ptr = lc.llama_get_logits_ith(self.loaded.ctx, row)
        return int(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).argmax())


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
