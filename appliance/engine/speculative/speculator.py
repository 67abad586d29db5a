"""One model's speculative decoding: its draft sources chained in the configured order, the
per-sequence acceptance estimates, the step planner (planner.py), the controller and the
counters the status endpoints show."""

from __future__ import annotations

import collections
import itertools
import time

from ...config import SpeculativeConfig
from .controller import Controller
from .draft_model import DraftModel
from .history import HistoryIndex
from .ngram import NgramIndex, PredictionIndex, PredictionLookup, match_class
from .planner import Acceptance, Candidate, StepCost, StepCosts, plan, survival

# A sequence's estimate for a source mixes in this many observations of its model's, and the
# model's, per position, this many of its own estimate over all positions (which starts at
# PRIOR_HAZARD), so that a few drafts do not decide alone.
SEQ_PRIOR_WEIGHT = 4.0
MODEL_PRIOR_WEIGHT = 2.0
PRIOR_HAZARD = 0.3
MAX_WATCHED = 24  # lookup drafts of a sequence waiting to be scored
DRAFT_MODEL_RETRY_AFTER = 64  # declined draft-model plans before one short draft is verified anyway
# The guard: a lone sequence whose steps with drafts have, all told, emitted GUARD_MARGIN fewer
# tokens per second than the model's plain steps (judged after GUARD_STEPS of them, then every
# GUARD_STEPS / 2) drafts nothing for its next GUARD_PAUSE lone steps, a pause that doubles each
# time it is judged so again (up to GUARD_MAX_PAUSE); in a batch the controller decides alone.
# The estimates the plan trusts are learnt over the model's recent requests, and the controller
# judges on its last 64 steps with drafts: after rewrites, whose drafts are right in long runs,
# a story's drafts of the same kinds are expected to be right far more often than they are, and
# the controller's window still holds the rewrites' steps. Judged on all the sequence's steps
# with drafts, not a recent window, so that a JSON answer's hard stretch (invented values) does
# not stop its copyable ones. Replayed in the bench's order (rewrites, JSON, stories; SmolLM2):
# stories 0.93×, 0.95×, 0.97× -> 0.97×, 0.96×, 0.98×, the rest unchanged. The margin is the
# controller's (it was 0.1 until 2026-12-01): replayed in the bench's order, 0.03 leaves the
# rewrites and JSON answers as they were and drafts 28 % fewer tokens in stories (25 instead of 35
# per story, of which 7 and 10 were right), where the server pays more per wasted row than the
# replay's cost table says (the stories replay at 0.99-1.0× and serve at 0.92-0.98×).
GUARD_STEPS = 8
GUARD_PAUSE = 16
GUARD_MAX_PAUSE = 512
GUARD_MARGIN = 0.03


class SeqDrafts:
    """A sequence's speculative state: its tokens (prompt and output), prompt-lookup index and
    acceptance per kind of draft (a lookup source and the class of its match's length, or the
    draft model); the runner fills `tokens` and reads `pending` after a step.

    Every lookup's whole draft is kept in `watch` and scored by the tokens the sequence then
    generates, also the part the plan did not verify: acceptance stays measured at every
    position, while drafting does not pay too."""

    __slots__ = ("tokens", "n_prompt", "index", "accept", "pending", "source", "watch", "cursor", "lone", "pause",
                 "next_pause", "survival", "predicted", "prediction_counts")

    def __init__(self, prompt: list[int], positions: int, predicted: PredictionIndex | None = None):
        self.tokens = list(prompt)
        self.n_prompt = len(prompt)
        self.index = NgramIndex()
        # the request's predicted answer (the "prediction" source), and its drafted tokens the
        # target compared: [taken, refused] (the runner counts them as it compares)
        self.predicted = PredictionLookup(predicted) if predicted else None
        self.prediction_counts = [0, 0]
        self.accept = _Estimates(positions, decay=0.8)
        self.pending: list[int] = []  # drafts being verified this step
        self.source = ""
        # [draft, where in tokens it starts, kind, positions credited so far]
        self.watch: list[list] = []
        self.cursor: tuple[int, int] | None = None  # (history generation, position) it follows
        self.lone = [0, 0, 0.0]  # its steps with drafts while alone: count, tokens emitted, seconds
        self.pause = 0  # steps left without drafts (the guard)
        self.next_pause = GUARD_PAUSE
        # kind -> (its estimate's version, the model's, chance of each position being accepted)
        self.survival: dict[str, tuple[int, int, list[float]]] = {}


class _Estimates(dict):
    """Acceptance per kind of draft, made on first use."""

    def __init__(self, positions: int, decay: float):
        super().__init__()
        self.positions, self.decay = positions, decay

    def __missing__(self, kind: str) -> Acceptance:
        a = self[kind] = Acceptance(self.positions, self.decay)
        return a


class Speculator:
    def __init__(self, cfg: SpeculativeConfig, history: HistoryIndex | None = None, draft: DraftModel | None = None):
        self.cfg = cfg
        self.sources = [s for s in cfg.sources if (s != "history" or history) and (s != "draft_model" or draft)]
        self.history = history
        self.draft = draft
        self.controller = Controller()
        self.costs = StepCosts()  # decode cost by rows, per number of sequences in the decode
        self.accept = _Estimates(cfg.max_draft, decay=0.98)
        self.draft_seconds = 0.0  # a draft model's time per drafted token (moving average)
        self._draft_declines = 0
        # tokens of one sequence one decode verifies exactly (speculative/exactness.py; set at load)
        self.exact_rows = cfg.max_draft + 1
        self.exact_kv: tuple[str, str] | None = None  # the KV types exact_rows was measured for
        self.stats = {"drafted": 0, "accepted": 0, "spec_steps": 0, "plain_steps": 0, "declined": 0, "guard_pauses": 0,
                      **{f"{s}_drafted": 0 for s in (*self.sources, "prediction")},
                      **{f"{s}_accepted": 0 for s in (*self.sources, "prediction")}}
        self._lengths: collections.deque[int] = collections.deque(maxlen=256)  # recent draft lengths
        self._model_hazards: dict[str, tuple[int, list[float]]] = {}  # kind -> (version, hazards)

    @property
    def cost(self) -> StepCost:
        """The cost model of a lone sequence's decodes (its token and drafts): the one the status's
        `step_ms_by_rows` shows."""
        return self.costs.of(1)

    def new_sequence(self, prompt: list[int], predicted: PredictionIndex | None = None) -> SeqDrafts:
        """A sequence's state; `predicted`: its request's predicted answer, a lookup source of its
        own (tried first)."""
        self.controller.new_request()
        return SeqDrafts(prompt, self.cfg.max_draft, predicted)

    def model_hazards(self, kind: str) -> list[float]:
        a = self.accept[kind]
        cached = self._model_hazards.get(kind)
        if cached is not None and cached[0] == a.version:
            return cached[1]
        pooled = (sum(a.fail) + MODEL_PRIOR_WEIGHT * PRIOR_HAZARD) / (sum(a.reach) + MODEL_PRIOR_WEIGHT)
        hazards = a.hazards([pooled] * len(a.reach), MODEL_PRIOR_WEIGHT)
        self._model_hazards[kind] = (a.version, hazards)
        return hazards

    def gains(self, st: SeqDrafts, kind: str, n: int) -> list[float]:
        """The chance that each of the next n drafts of this kind is accepted, for this sequence
        (worked out again only when its or the model's estimate for the kind has changed)."""
        own, model = st.accept[kind], self.accept[kind]
        cached = st.survival.get(kind)
        if cached is None or cached[0] != own.version or cached[1] != model.version:
            chances = survival(own.hazards(self.model_hazards(kind), SEQ_PRIOR_WEIGHT), len(own.reach) - 1)
            cached = st.survival[kind] = (own.version, model.version, chances)
        return cached[2][:n]

    def propose(self, seqs: list[tuple[int, SeqDrafts, int]], base_rows: int) -> None:
        """Fill `pending` of each (seq id, state, room) with the drafts worth verifying in a step
        whose plain decode has `base_rows` rows. Each lookup source listed before draft_model
        is asked; the sequence takes the draft with the most expected accepted tokens (ties:
        the configured order), or the draft model's where no lookup has one. The planner then
        sets how many of them to verify, within room and max_draft."""
        for _, st, _ in seqs:
            st.pending, st.source = [], ""
            if st.watch:
                st.watch = [w for w in st.watch if not self._score(st, w)]
        todo = []
        for sid, st, room in seqs:
            if st.pause > 0 and len(seqs) == 1:  # the guard acts where it judges: on lone steps
                st.pause -= 1
            elif room > 0:
                todo.append((sid, st, min(room, self.cfg.max_draft)))
        if base_rows > 1 and len(todo) < base_rows:
            return  # several sequences draft all or none (planner._plan_streams): one cannot
        # (sid, st, source, drafts or None for the draft model, gains of each further draft)
        chosen: list[tuple[int, SeqDrafts, str, list[int] | None, list[float]]] = []
        lookups = list(itertools.takewhile(lambda src: src != "draft_model", self.sources))
        for sid, st, k in todo:
            best, best_gain = None, 0.0
            # the lookup whose draft promises the most; ties: the request's prediction, then configured order
            for source in (["prediction", *lookups] if st.predicted is not None else lookups):
                for kind, found in self._lookups(source, st, k):
                    if len(st.watch) < MAX_WATCHED:  # every source's draft is scored, chosen or not
                        st.watch.append([list(found), len(st.tokens), kind, 0])
                    gains = self.gains(st, kind, len(found))
                    if best is None or sum(gains) > best_gain:
                        best, best_gain = (sid, st, source, list(found), gains), sum(gains)
            if best is not None:
                chosen.append(best)
            elif "draft_model" in self.sources:
                chosen.append((sid, st, "draft_model", None, self.gains(st, "draft_model", k)))
            elif base_rows > 1:
                return  # this one has no draft, so none drafts: the other lookups would be wasted
        if not chosen:
            return
        cands = [Candidate(gains, self.draft_seconds if src == "draft_model" else 0.0) for _, _, src, _, gains in chosen]
        counts = plan(base_rows, cands, self.costs.of(base_rows), self.costs.previous)
        jobs = []
        for (sid, st, src, drafts, gains), k in zip(chosen, counts):
            cap = len(gains)
            if k > 0:
                k = min(cap, max(k, self.cfg.min_draft))
            if k == 0:
                self.stats["declined"] += 1
                if src == "draft_model":  # its estimate moves only with verified drafts: try it now and then
                    self._draft_declines += 1
                    if self._draft_declines >= DRAFT_MODEL_RETRY_AFTER:
                        self._draft_declines, k = 0, min(cap, 2)
            if src == "draft_model":
                if k > 0:
                    jobs.append((sid, st, k))
                continue
            if k > 0:
                st.pending, st.source = drafts[:k], src
        if jobs:
            t0 = time.perf_counter()
            found = self.draft.draft([(sid, st.tokens, k) for sid, st, k in jobs])
            n = sum(len(d) for d in found)
            if n:
                per = (time.perf_counter() - t0) / n
                self.draft_seconds = per if self.draft_seconds == 0 else self.draft_seconds * 0.8 + per * 0.2
            for (_, st, _), drafts in zip(jobs, found):
                st.pending, st.source = list(drafts), "draft_model"

    def _lookups(self, source: str, st: SeqDrafts, k: int) -> list[tuple[str, list[int]]]:
        """A lookup source's drafts for a sequence, each with its kind: the source and the class
        of the length of the match it continues (ngram.match_class: a longer match is a surer
        draft). The history gives its most
        recent match and, where the sequence follows an earlier output, the match aligned with
        that output ("aligned:n"), which then moves the sequence's cursor."""
        if source == "ngram":
            found, n = st.index.lookup_match(st.tokens, k)
            return [(f"ngram:{match_class(n)}", found)] if found else []
        if source == "prediction":
            found, n = st.predicted.lookup(st.tokens[st.n_prompt :], k)
            return [(f"prediction:{match_class(n)}", found)] if found else []
        h = self.history
        out = []
        found, n, at = h.lookup_at(st.tokens, k)
        if found:
            out.append((f"history:{match_class(n)}", found))
        cursor = st.cursor[1] if st.cursor is not None and st.cursor[0] == h.generation else -1
        aligned, an, aat = h.lookup_aligned(st.tokens, k, cursor)
        if aligned:
            at = aat
            if aligned != found:
                out.append((f"aligned:{match_class(an)}", aligned))
        if at >= 0:
            st.cursor = (h.generation, at)
        return out

    def _score(self, st: SeqDrafts, watched: list) -> bool:
        """Score a watched lookup draft against the tokens generated since; False while
        undecided, its positions matched so far credited (Acceptance.credit)."""
        draft, at, kind, credited = watched
        tokens = st.tokens
        got = min(len(tokens) - at, len(draft))  # tokens generated since, up to the draft's length
        m = credited  # those were matched already (tokens are only appended)
        while m < got and tokens[at + m] == draft[m]:
            m += 1
        if m == got < len(draft):  # all matched so far: wait for more tokens
            if m > credited:
                st.accept[kind].credit(credited, m)
                self.accept[kind].credit(credited, m)
                watched[3] = m
            return False
        drafted = len(draft) if m == len(draft) else m + 1
        st.accept[kind].update(drafted, m, credited)
        self.accept[kind].update(drafted, m, credited)
        return True

    def lone_step(self, st: SeqDrafts, seconds: float, tokens: int) -> None:
        """A step that verified drafts of this sequence alone (the guard's measure)."""
        lone = st.lone
        lone[0] += 1
        lone[1] += tokens
        lone[2] += seconds
        if lone[0] < GUARD_STEPS or lone[0] % (GUARD_STEPS // 2):
            return
        plain = self.controller.plain_rate(1)
        if plain > 0 and lone[1] < lone[2] * plain * (1 - GUARD_MARGIN):
            st.pause = st.next_pause
            st.next_pause = min(GUARD_MAX_PAUSE, st.next_pause * 2)
            self.stats["guard_pauses"] += 1

    def verified(self, st: SeqDrafts, accepted: int) -> None:
        drafted = len(st.pending)
        if not drafted:
            return
        self.stats["drafted"] += drafted
        self.stats["accepted"] += accepted
        self.stats[f"{st.source}_drafted"] += drafted
        self.stats[f"{st.source}_accepted"] += accepted
        self._lengths.append(drafted)
        if st.source == "draft_model":  # (lookup drafts are scored as shadows, in full)
            st.accept[st.source].update(drafted, accepted)
            self.accept[st.source].update(drafted, accepted)
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
        """Plain counters (for the status endpoint and /metrics)."""
        drafted, accepted = self.stats["drafted"], self.stats["accepted"]
        lengths = sorted(self._lengths)
        return {
            **self.stats,
            "sources": list(self.sources),
            "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
            "expected_run": {kind: round(sum(survival(self.model_hazards(kind), self.cfg.max_draft)), 2)
                             for kind in sorted(self.accept)},
            "median_draft_length": lengths[len(lengths) // 2] if lengths else None,
            "step_ms_by_rows": self.cost.snapshot(),
            "step_ms_by_sequences": self.costs.snapshot(),
            "controller_on": self.controller.on,
            "controller": self.controller.snapshot(),
            "history_tokens": self.history.n_tokens if self.history is not None else None,
            "exact_verify_rows": self.exact_rows,
            "exact_verify_kv": list(self.exact_kv) if self.exact_kv else None,
        }
