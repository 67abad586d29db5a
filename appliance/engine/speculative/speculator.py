"""One model's speculative decoding: its draft sources chained in the configured order, the
per-sequence draft lengths, the controller and the counters the status endpoints show."""

from __future__ import annotations

import collections

from ...config import SpeculativeConfig
from .controller import Controller, DraftLength
from .draft_model import DraftModel
from .history import HistoryIndex
from .ngram import NgramIndex

SOURCES = ("ngram", "history", "draft_model")


class SeqDrafts:
    """A sequence's speculative state: its tokens (prompt and output), prompt-lookup index and
    draft length; the runner fills `tokens` and reads `pending` after a step."""

    __slots__ = ("tokens", "n_prompt", "index", "length", "pending", "source")

    def __init__(self, prompt: list[int], lo: int, hi: int):
        self.tokens = list(prompt)
        self.n_prompt = len(prompt)
        self.index = NgramIndex()
        self.length = DraftLength(lo, hi)
        self.pending: list[int] = []  # drafts being verified this step
        self.source = ""


class Speculator:
    def __init__(self, cfg: SpeculativeConfig, history: HistoryIndex | None = None, draft: DraftModel | None = None):
        self.cfg = cfg
        self.sources = [s for s in cfg.sources if (s != "history" or history) and (s != "draft_model" or draft)]
        self.history = history
        self.draft = draft
        self.controller = Controller()
        # tokens of one sequence one decode verifies exactly (speculative/exactness.py; set at load)
        self.exact_rows = cfg.max_draft + 1
        self.stats = {"drafted": 0, "accepted": 0, "spec_steps": 0, "plain_steps": 0,
                      **{f"{s}_drafted": 0 for s in self.sources}, **{f"{s}_accepted": 0 for s in self.sources}}
        self._lengths: collections.deque[int] = collections.deque(maxlen=256)  # recent draft lengths

    def new_sequence(self, prompt: list[int]) -> SeqDrafts:
        return SeqDrafts(prompt, self.cfg.min_draft, self.cfg.max_draft)

    def propose(self, seqs: list[tuple[int, SeqDrafts, int]]) -> None:
        """Fill `pending` of each (seq id, state, room) with up to min(room, its length) drafts,
        trying the sources in order; a sequence keeps the first source that has any."""
        todo = [(sid, st, min(room, st.length.k)) for sid, st, room in seqs]
        todo = [t for t in todo if t[2] > 0]
        for st in (t[1] for t in seqs):
            st.pending, st.source = [], ""
        for source in self.sources:
            if not todo:
                break
            if source == "draft_model":
                found = self.draft.draft([(sid, st.tokens, k) for sid, st, k in todo])
            elif source == "ngram":
                found = [st.index.lookup(st.tokens, k) for _, st, k in todo]
            else:
                found = [self.history.lookup(st.tokens, k) for _, st, k in todo]
            rest = []
            for (sid, st, k), drafts in zip(todo, found):
                if drafts:
                    st.pending, st.source = list(drafts), source
                else:
                    rest.append((sid, st, k))
            todo = rest

    def verified(self, st: SeqDrafts, accepted: int) -> None:
        drafted = len(st.pending)
        if not drafted:
            return
        self.stats["drafted"] += drafted
        self.stats["accepted"] += accepted
        self.stats[f"{st.source}_drafted"] += drafted
        self.stats[f"{st.source}_accepted"] += accepted
        self._lengths.append(drafted)
        st.length.update(drafted, accepted)
        st.pending = []

    def finished(self, seq_id: int, st: SeqDrafts | None) -> None:
        if self.draft is not None:
            self.draft.forget(seq_id)
        if st is not None and self.history is not None:
            self.history.add(st.tokens[st.n_prompt :])

    def close(self) -> None:
        if self.history is not None:
            self.history.save()
        if self.draft is not None:
            self.draft.free()

    def snapshot(self) -> dict:
        """Plain counters (for the status endpoint and, later, /metrics)."""
        drafted, accepted = self.stats["drafted"], self.stats["accepted"]
        lengths = sorted(self._lengths)
        return {
            **self.stats,
            "sources": list(self.sources),
            "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
            "median_draft_length": lengths[len(lengths) // 2] if lengths else None,
            "controller_on": self.controller.on,
            "controller": self.controller.snapshot(),
            "history_tokens": self.history.n_tokens if self.history is not None else None,
            "exact_verify_rows": self.exact_rows,
        }
