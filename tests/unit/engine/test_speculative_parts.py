"""Speculative decoding's pieces on their own: the rejection rule (statistically, fixed seed),
prompt lookup, the history index and its file, the draft planner, the controller, config errors."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.config import ConfigError, parse_config
from appliance.config import SpeculativeConfig
from appliance.engine.speculative.controller import Controller, _Window
from appliance.engine.speculative.history import HistoryIndex
from appliance.engine.speculative.ngram import (
    MATCH_CAP, NgramIndex, PredictionIndex, PredictionLookup, match_class, match_length,
)
from appliance.engine.speculative.planner import Acceptance, Candidate, StepCost, plan, survival
from appliance.engine.speculative.speculator import Speculator
from appliance.engine.speculative.rejection import accept_or_resample, draw

P = np.array([0.40, 0.25, 0.15, 0.10, 0.06, 0.04])  # the target's distribution
Q = np.array([0.05, 0.10, 0.50, 0.05, 0.20, 0.10])  # a draft distribution far from it
CHI2_DF5_P001 = 20.52  # chi-square critical value, 5 degrees of freedom, p = 0.001


def chi2(counts: np.ndarray, p: np.ndarray) -> float:
    expected = p * counts.sum()
    return float(((counts - expected) ** 2 / expected).sum())


def speculative_samples(n: int, q: np.ndarray | None, seed: int, rule=accept_or_resample) -> tuple[np.ndarray, float]:
    rng = np.random.default_rng(seed)
    counts = np.zeros(len(P))
    accepted = 0
    for _ in range(n):
        d = draw(Q, rng)  # the drafter proposes from Q; a one-hot q means the drafter was deterministic
        ok, token = rule(P, d, rng, q)
        accepted += ok
        counts[token] += 1
    return counts, accepted / n


@pytest.mark.parametrize("q", [Q, None], ids=["draft-distribution", "deterministic-draft"])
def test_the_rejection_rule_leaves_the_target_distribution_unchanged(q):
    counts, rate = speculative_samples(60_000, q, seed=1234)
    assert chi2(counts, P) < CHI2_DF5_P001, counts / counts.sum()
    # acceptance: sum(min(p, q)) for a sampling drafter, sum(q * p) when each draft is taken as certain
    expected = np.minimum(P, Q).sum() if q is not None else float((Q * P).sum())
    assert rate == pytest.approx(expected, abs=0.01)


def test_the_statistic_sees_a_wrong_rule():
    def always_accept(p, d, rng, q):
        return True, d

    counts, _ = speculative_samples(60_000, Q, seed=1234, rule=always_accept)
    assert chi2(counts, P) > 10 * CHI2_DF5_P001  # the drafts' distribution, not the target's


def test_a_draft_equal_to_a_certain_target_is_always_accepted():
    rng = np.random.default_rng(0)
    p = np.array([0.0, 1.0, 0.0])
    assert all(accept_or_resample(p, 1, rng) == (True, 1) for _ in range(100))
    assert all(accept_or_resample(p, 0, rng) == (False, 1) for _ in range(100))


def test_prompt_lookup_takes_the_longest_most_recent_match_and_never_the_suffix_itself():
    idx = NgramIndex(sizes=(3, 2))
    tokens = [1, 2, 3, 9, 9, 7, 2, 3, 8, 8, 1, 2, 3]
    assert idx.lookup(tokens, 4) == [9, 9, 7, 2]  # 1 2 3 → 9 (3-gram) beats 2 3 → 8 (2-gram, more recent)
    tokens += [5, 2, 3]
    assert idx.lookup(tokens, 2) == [5, 2]  # now only the 2-gram "2 3" matches; its latest occurrence wins
    assert NgramIndex().lookup([4, 5, 6, 7], 3) == []
    assert idx.lookup(tokens, 0) == []


def test_prompt_lookup_drafts_from_a_single_matching_token():
    # a value copied from the prompt after a token the prompt does not have before it
    # (`"Maria` in the answer, ` Maria` in the prompt) matches on its own first token only
    prompt = [50, 11, 12, 13, 51, 60]
    assert NgramIndex().lookup_match(prompt + [70, 11], 3) == ([12, 13, 51], 1)
    assert NgramIndex(sizes=(5, 4, 3, 2)).lookup_match(prompt + [70, 11], 3) == ([], 0)


def test_prompt_lookup_continues_a_repeating_tail_past_the_end_of_the_sequence():
    # the latest earlier match of the suffix (0, 1) is one period back: the tokens after it reach
    # the end of the sequence, and the draft goes on with the same period instead of stopping there
    loop = [7, 8, 0, 1, 0, 1, 0, 1]
    assert NgramIndex(sizes=(2,)).lookup_match(loop, 5) == ([0, 1, 0, 1, 0], 4)  # 0 1 0 1 matched (8 ≠ 1 before it)
    assert NgramIndex(sizes=(3,)).lookup_match([5, 6, 7, 1, 2, 3, 1, 2, 3], 4) == ([1, 2, 3, 1], 3)
    assert NgramIndex(sizes=(2,)).lookup_match([4, 4, 4], 3) == ([4, 4, 4], 2)


def test_a_match_is_followed_backwards_and_classed_by_its_length():
    tokens = [9, 1, 2, 3, 4, 5, 6, 7, 50, 8, 1, 2, 3, 4, 5, 6, 7]
    draft, length = NgramIndex().lookup_match(tokens, 2)
    assert draft == [50, 8] and length == 7  # the 5-gram goes on back to 1 (9 ≠ 8 before it)
    assert match_length(tokens, 8, tokens, 5, cap=6) == 6
    assert match_length([5, -1, 1, 2], 4, [5, 1, 2], 2) == 2  # a separator ends it
    assert [match_class(n) for n in (1, 4, 5, 7, 8, 15, 16, 40)] == [1, 4, 5, 5, 8, 8, 16, 16]
    h = HistoryIndex(None)
    h.add([20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30])
    assert h.lookup_at([0, 20, 21, 22, 23, 24, 25, 26, 27], 2)[:2] == ([28, 29], 8)


def test_history_index_drafts_across_outputs_and_survives_a_restart(tmp_path):
    path = tmp_path / "spec" / "model.history"
    h = HistoryIndex(path, max_tokens=1000, save_every=100)
    h.add([10, 11, 12, 13, 14, 15])
    h.add([20, 21, 22])
    assert h.lookup([99, 11, 12], 3) == [13, 14, 15]
    assert h.lookup([21, 22], 5) == []  # the end of an output: nothing follows it
    h.save()
    again = HistoryIndex(path, max_tokens=1000)
    assert again.n_tokens == 9 and again.lookup([12, 13], 2) == [14, 15]


def test_history_index_saves_every_few_outputs_off_the_adding_thread(tmp_path):
    path = tmp_path / "model.history"
    h = HistoryIndex(path, max_tokens=1000, save_every=2)
    h.add([10, 11, 12])
    assert not path.exists()
    h.add([20, 21, 22])  # the second: written by a thread of its own
    writer = h._writer
    assert writer is not None and writer.name == "eie-history-save"
    writer.join()
    assert HistoryIndex(path).lookup([10, 11], 1) == [12]
    h.add([30, 31, 32])
    h.save()  # at close: now, after any write in flight
    again = HistoryIndex(path)
    assert again.n_tokens == 9 and again.lookup([30, 31], 1) == [32]


def test_history_index_is_bounded_and_ignores_a_foreign_file(tmp_path):
    h = HistoryIndex(None, max_tokens=300)
    for i in range(10):
        h.add(list(range(i * 100, i * 100 + 100)))
    assert h.n_tokens <= 300
    assert h.lookup([901, 902], 2) == [903, 904] and h.lookup([1, 2], 2) == []  # the oldest are gone
    bad = tmp_path / "x.history"
    bad.write_bytes(b"not a history")
    assert HistoryIndex(bad).n_tokens == 0


def test_history_draft_stops_where_earlier_occurrences_disagree():
    h = HistoryIndex(None)
    h.add([5, 6, 7, 8, 40, 9, 1])  # the same skeleton (5 6 7 8 _ 9) with other values
    h.add([5, 6, 7, 8, 41, 9, 2])
    assert h.lookup_at([3, 5, 6], 5)[:2] == ([7, 8], 2)  # 41 or 40: the draft stops before the value
    assert h.lookup_at([40, 9], 3)[0] == [1]  # one occurrence: nothing to disagree with
    assert h.lookup_at([8, 41, 9], 3)[0] == [2]
    h.add([5, 6, 7, 8, 40, 9, 3])
    assert h.lookup_at([5, 6, 7, 8, 40], 2)[0] == [9]  # 9 then 3 or 1: cut at the third value
    for _ in range(6):
        h.add([70, 71, 72])
    h.add([70, 71, 73])
    assert h.lookup_at([70, 71], 1)[0] == []  # any of the last few earlier occurrences disagreeing cuts


# A structured answer: keys 10.., ":" 1, values 50.., separator 2 3 (as `",\n  "` in JSON)
SKELETON = [10, 1, 50, 2, 3, 11, 1, 51, 2, 3, 12, 1, 52, 2, 3, 13, 1, 53]


def test_aligned_history_lookup_follows_the_skeleton_of_an_earlier_output():
    h = HistoryIndex(None)
    h.add(SKELETON)
    h.add([7, 2, 3, 99])  # a later output where the separator is followed by something else
    now = [10, 1, 60, 2, 3]  # the same skeleton with another first value
    # the most recent occurrence goes on with 99, the earlier ones with keys: no agreed draft
    assert h.lookup_at(now, 3) == ([], 2, len(SKELETON) + 4)  # (after the separator and 7, 2, 3)
    draft, n, at = h.lookup_aligned(now, 3, cursor=0)
    assert (draft, n) == ([11, 1, 51], 2) and at == 5  # the next key of the earlier output
    # after the second value, the nearest occurrence after the cursor is the third key
    assert h.lookup_aligned([10, 1, 60, 2, 3, 11, 1, 61, 2, 3], 2, cursor=at)[0] == [12, 1]
    assert h.lookup_aligned(now, 3, cursor=len(SKELETON) - 1)[0] == []  # only in the next output
    far = HistoryIndex(None)
    far.add(list(range(100, 180)) + [2, 3, 42])
    assert far.lookup_aligned([2, 3], 1, cursor=0)[0] == []  # beyond the alignment window
    assert far.lookup_aligned([2, 3], 1, cursor=20)[0] == [42]


def test_a_sequence_follows_its_history_cursor_and_offers_the_aligned_draft():
    h = HistoryIndex(None)
    h.add(SKELETON)
    h.add([7, 2, 3, 99])
    spec = Speculator(SpeculativeConfig(sources=["history"]), history=h)
    st = spec.new_sequence([5, 10, 1])
    assert spec._lookups("history", st, 4) == [("history:2", [50, 2, 3, 11])]  # cursor set here
    st.tokens += [60, 2, 3]  # another value, then the separator
    assert spec._lookups("history", st, 3) == [("aligned:2", [11, 1, 51])]  # (the most recent: disputed)
    h.add([1, 2])  # more history: positions stay, so does the cursor
    st.tokens += [11, 1, 61, 2, 3]
    assert ("aligned:2", [12, 1, 52]) in spec._lookups("history", st, 3)


def cpu_like_cost(per_row: float = 0.5, base: float = 0.016) -> StepCost:
    """A cost table measured as on 2 cores: each extra row adds half a one-row decode."""
    cost = StepCost()
    for rows in range(1, 40):
        cost.observe(rows, base * (1 + per_row * (rows - 1)))
    return cost


def geometric(a: float, n: int = 16) -> list[float]:
    return [a ** j for j in range(1, n + 1)]


def test_the_plan_drafts_more_the_likelier_drafts_are_accepted():
    cost = cpu_like_cost()
    lengths = [plan(1, [Candidate(geometric(a))], cost)[0] for a in (0.3, 0.6, 0.8, 0.9, 0.97)]
    assert lengths[0] == 0  # a draft rarely accepted costs more than it brings
    assert lengths == sorted(lengths) and lengths[-1] >= 5
    # where verifying is cheap, the same acceptance is worth longer drafts
    assert plan(1, [Candidate(geometric(0.8))], cpu_like_cost(per_row=0.1))[0] > lengths[2]
    # runs that, once started, go on (a rewrite copying its text) are worth drafting in full
    assert plan(1, [Candidate([0.8] + [0.79] * 15)], cost)[0] == 16


def test_a_lone_sequence_drafts_only_what_pays():
    cost = cpu_like_cost()
    assert plan(1, [Candidate(geometric(0.99), draft_cost=0.05)], cost) == [0]  # a draft model slower than the target
    assert plan(1, [Candidate(geometric(0.9))], StepCost()) == [0]  # nothing measured yet: no plan


def test_several_sequences_draft_equally_in_one_pass_or_not_at_all():
    cost = cpu_like_cost(per_row=0.2)
    k = plan(3, [Candidate(geometric(0.95)), Candidate(geometric(0.95, 2)), Candidate(geometric(0.9))], cost)
    assert k == [2, 2, 2]  # the same for each, at most the shortest draft
    rows = 3 * (1 + 2)
    assert (3 + 2 * (0.95 + 0.95 ** 2) + 0.9 + 0.81) / cost.time(rows) > 3 / cost.time(3)
    # a sequence without a draft would cost a second pass: none drafts
    assert plan(4, [Candidate(geometric(0.95)), Candidate(geometric(0.95)), Candidate(geometric(0.95))], cost) == [0, 0, 0]
    assert plan(2, [Candidate(geometric(0.3)), Candidate(geometric(0.3))], cost) == [0, 0]


def test_step_cost_fits_a_line_and_starts_from_the_prior_slope():
    cost = StepCost(prior_row_cost=0.5, forget=1.0)
    cost.observe(1, 0.010)
    assert cost.time(3) == pytest.approx(0.020)  # only one-row decodes seen: the prior slope
    for _ in range(50):
        cost.observe(1, 0.010)
        cost.observe(9, 0.030)  # each further row costs 2.5 ms
    a, b = cost.fit()
    assert a == pytest.approx(0.010, rel=0.05) and b == pytest.approx(0.0025, rel=0.1)
    cost.observe(5, 0.5)  # one stalled decode does not make wide decodes look dear
    assert cost.time(17) < 0.06


def test_step_cost_keeps_the_measured_shape_of_each_width_seen_often_enough():
    cost = StepCost(forget=1.0)
    tiled = {1: 0.010, 2: 0.013, 3: 0.016, 4: 0.018, 5: 0.032, 6: 0.033, 7: 0.034, 8: 0.031}  # a 4-row tile kernel
    for _ in range(3):
        for rows, seconds in tiled.items():
            cost.observe(rows, seconds)
    assert cost.time(5) == pytest.approx(0.032, rel=0.1) and cost.time(8) == pytest.approx(0.031, rel=0.1)
    assert cost.time(5) > 1.5 * cost.time(4) and cost.time(8) < cost.time(5)
    assert cost.time(12) == pytest.approx(sum(cost.fit()) + 10 * cost.fit()[1])  # never seen: the line
    assert set(cost.snapshot()["measured_ms"]) >= {str(n) for n in range(2, 9)}
    stalled = StepCost(forget=1.0)
    for _ in range(3):
        for rows, seconds in tiled.items():
            stalled.observe(rows, seconds)
    stalled.observe(5, 0.5)
    stalled.observe(5, 0.5)  # two stalls: neither the width's median nor the line moves far
    assert stalled.time(5) < 0.04 and stalled.time(4) < 0.022
    # drafts of a kind that pays on the line but not at the widths this kernel makes dear:
    # the plan takes 3 (4 rows) or 7 (8 rows), never 4 to 6
    k = plan(1, [Candidate(geometric(0.93))], cost)[0]
    assert k in (3, 7)
    line = StepCost(forget=1.0)
    for rows, seconds in tiled.items():
        line.observe(rows, seconds)  # seen once each: the line alone
    assert plan(1, [Candidate(geometric(0.93))], line)[0] != k
    # the machine gets twice as slow (every width): the shape stays, also for widths not seen again
    slow = StepCost(forget=0.9)
    for _ in range(3):
        for rows, seconds in tiled.items():
            slow.observe(rows, seconds)
    for _ in range(60):
        slow.observe(1, 0.020)
        slow.observe(4, 0.036)
    assert slow.time(5) > 1.5 * slow.time(4) and slow.time(5) > 0.045


def test_step_cost_learns_what_a_change_of_width_costs_and_the_plan_pays_for_it():
    cost = cpu_like_cost()
    steady = {rows: cost.time(rows) for rows in (1, 2, 3)}
    for _ in range(40):  # one row after a wider decode: 3 ms more; a wider one after one row: 0.5 ms more
        cost.observe(1, steady[1], previous=1)
        cost.observe(3, steady[3] + 0.0005, previous=1)
        cost.observe(3, steady[3], previous=3)
        cost.observe(1, steady[1] + 0.003, previous=3)
    assert cost.switch_down == pytest.approx(0.003, rel=0.1)
    assert cost.switch_up == pytest.approx(0.0005, rel=0.2)
    assert cost.time(1) == pytest.approx(steady[1], rel=0.02) and cost.time(3) == pytest.approx(steady[3], rel=0.02)
    snap = cost.snapshot()
    assert snap["switch_narrower_ms"] == pytest.approx(3.0, rel=0.1) and snap["switch_wider_ms"] > 0
    drafts = [Candidate([0.6, 0.5])]
    assert plan(1, drafts, cpu_like_cost())[0] > 0  # pays on the steady costs alone
    # after plain steps: going wide and back costs 3.5 ms more than it brings
    assert plan(1, drafts, cost, previous=1) == [0]
    # after a step with one draft: a plain step pays the way back now, a draft later
    assert plan(1, drafts, cost, previous=2)[0] > 0
    assert cost.switch_time(1, 1, 2) == pytest.approx(cost.switch_down)
    assert cost.switch_time(2, 1, 2) == pytest.approx(cost.switch_down)


def test_acceptance_counts_each_position_a_draft_reached_and_where_it_failed():
    a = Acceptance(positions=8, decay=1.0)
    a.update(4, 4)
    a.update(4, 1)
    a.update(8, 0)
    assert a.reach[1:6] == [3, 2, 1, 1, 0] and a.fail[1:4] == [1, 1, 0]
    h = a.hazards([0.5] * 9, weight=0)[:4]
    assert h[1:] == [pytest.approx(1 / 3), pytest.approx(1 / 2), 0.0]
    assert survival(h, 3) == [pytest.approx(2 / 3), pytest.approx(1 / 3), pytest.approx(1 / 3)]
    assert Acceptance(8, decay=1.0).hazards([0.3] * 9, weight=4)[5] == pytest.approx(0.3)  # no data: the prior


def test_lookup_drafts_are_scored_in_full_by_what_the_sequence_generates():
    spec = Speculator(SpeculativeConfig(sources=["ngram"]))
    for rows in range(1, 20):
        spec.cost.observe(rows, 0.01 * rows)  # verification as dear as decoding: nothing pays
    st = spec.new_sequence([1, 2, 3, 4, 5, 9, 1, 2, 3])
    spec.propose([(0, st, 16)], 1)
    # a 3-gram matched six tokens back: the draft repeats those six (ngram.periodic_continuation)
    assert st.pending == [] and st.watch == [[([4, 5, 9, 1, 2, 3] * 3)[:16], 9, "ngram:3", 0]]
    st.tokens += [4, 5, 7]  # generated: the first two drafts were right, the third not
    spec.propose([(0, st, 16)], 1)
    assert st.accept["ngram:3"].reach[1:5] == [1, 1, 1, 0] and st.accept["ngram:3"].fail[3] == 1
    assert spec.accept["ngram:3"].reach[3] == 1


def test_a_draft_still_running_is_credited_position_by_position_and_counted_once():
    # Without credit, a long run in progress would count only when it ends, while the short runs
    # around it count at once: the estimate would be lowest exactly while the source is right.
    spec = Speculator(SpeculativeConfig(sources=["ngram"]))
    for rows in range(1, 20):
        spec.cost.observe(rows, 0.01 * rows)
    st = spec.new_sequence([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 1, 2, 3])
    spec.propose([(0, st, 8)], 1)
    draft = st.watch[0][0]
    assert draft == [4, 5, 6, 7, 8, 9, 10, 11]
    st.tokens += draft[:5]  # five right so far, the draft undecided
    spec.propose([(0, st, 8)], 1)
    first = next(w for w in st.watch if w[0] == draft)
    assert first[3] == 5 and st.accept["ngram:3"].reach[1:7] == [1, 1, 1, 1, 1, 0]
    assert st.accept["ngram:3"].fail[1:7] == [0] * 6
    st.tokens += [9, 10, 0]  # then two more right and a wrong one: decided at position 8
    spec.propose([(0, st, 8)], 1)
    assert not any(w[0] == draft for w in st.watch)
    a = st.accept["ngram:3"]  # (decay 0.8 at each decided draft: the credit before it fades once)
    assert a.reach[1:10] == pytest.approx([0.8] * 5 + [1, 1, 1, 0]) and a.fail[1:10] == [0] * 7 + [1, 0]


def test_in_a_batch_no_lookup_is_made_once_one_sequence_cannot_draft():
    # several sequences verify the same number of drafts or none (planner._plan_streams)
    spec = Speculator(SpeculativeConfig(sources=["ngram"]))
    for rows in range(1, 20):
        spec.cost.observe(rows, 0.001)  # rows free: every draft would pay
    plain = spec.new_sequence([1, 2, 3, 4, 5])  # nothing repeats: no draft
    repeating = spec.new_sequence([7, 8, 9, 7, 8])
    spec.propose([(0, plain, 16), (1, repeating, 16)], 2)
    assert plain.pending == repeating.pending == [] and repeating.watch == []  # not even looked up
    spec.propose([(1, repeating, 16)], 2)  # the other decoding sequence does not speculate
    assert repeating.pending == [] and repeating.watch == []
    spec.propose([(1, repeating, 16)], 1)  # alone it drafts
    assert repeating.pending[:2] == [9, 7]


def test_the_gains_follow_every_change_of_the_estimates_they_are_kept_for():
    spec = Speculator(SpeculativeConfig(sources=["ngram"]))
    st = spec.new_sequence([1, 2, 3])
    before = spec.gains(st, "ngram:3", 4)
    assert spec.gains(st, "ngram:3", 4) is not before and spec.gains(st, "ngram:3", 4) == before
    st.accept["ngram:3"].update(4, 4)  # the sequence's own estimate moves
    own = spec.gains(st, "ngram:3", 4)
    assert own[3] > before[3]
    spec.accept["ngram:3"].credit(0, 3)  # and the model's
    assert spec.gains(st, "ngram:3", 4) != own
    fresh = Speculator(SpeculativeConfig(sources=["ngram"]))  # the same counts, nothing cached
    fresh_st = fresh.new_sequence([1, 2, 3])
    fresh_st.accept["ngram:3"].update(4, 4)
    fresh.accept["ngram:3"].credit(0, 3)
    assert spec.gains(st, "ngram:3", 16) == fresh.gains(fresh_st, "ngram:3", 16)


def test_a_controller_window_keeps_the_totals_of_its_last_steps():
    w = _Window(4)
    rng = np.random.default_rng(3)
    steps = [(float(rng.uniform(0.001, 0.02)), int(rng.integers(1, 9))) for _ in range(50)]
    for i, (s, t) in enumerate(steps):
        w.append(s, t)
        last = steps[max(0, i - 3) : i + 1]
        assert len(w) == len(last) and w.tokens == sum(x for _, x in last)
        assert w.seconds == pytest.approx(sum(x for x, _ in last), rel=1e-12)
        assert w.rate() == pytest.approx(w.tokens / w.seconds)
    w.clear()
    assert len(w) == 0 and w.rate() == 0.0


def drive(c: Controller, steps: int, spec_rate: float, plain_rate: float, batch: int = 1) -> list[bool]:
    """Run the controller over steps whose tokens per second are given; what it chose each step."""
    chosen = []
    for _ in range(steps):
        spec = c.speculate(batch)
        chosen.append(spec)
        c.record(batch, spec, 1.0 / (spec_rate if spec else plain_rate), 1)
    return chosen


def test_controller_turns_speculation_off_where_it_does_not_pay_and_probes_again():
    c = Controller(probe_every=16, probe_steps=16, reprobe_after=64)
    assert drive(c, 60, spec_rate=60, plain_rate=90).count(False) == 15  # a baseline step in 4 to begin with
    assert c.on  # 15 plain steps: not enough to judge
    drive(c, 4, spec_rate=60, plain_rate=90)
    assert not c.on and c.switches_off == 1
    chosen = drive(c, 400, spec_rate=60, plain_rate=90)
    assert sum(chosen) == 32  # it still samples speculation now and then (16 steps), with growing waits
    drive(c, 400, spec_rate=200, plain_rate=90)  # the workload changed: speculation pays again
    assert c.on and c.switches_on >= 1


def test_a_probe_judges_its_steps_with_speculation_on_declined_ones_included():
    def drive_declining(c: Controller, steps: int, spec_rate: float, drafted_every: int,
                        declined_rate: float = 87) -> list[bool]:
        """Steps where the plan verifies drafts only in one in `drafted_every`; the others pay
        for the lookups and the plan (`declined_rate`, below the plain 90)."""
        chosen = []
        for n in range(steps):
            spec = c.speculate(1)
            chosen.append(spec)
            drafted = spec and n % drafted_every == 0
            c.record(1, spec, 1.0 / (spec_rate if drafted else declined_rate if spec else 90), 1)
        return chosen

    c = Controller(probe_every=16, probe_steps=16, reprobe_after=64)
    drive(c, 64, spec_rate=60, plain_rate=90)
    assert not c.on
    # a plan that declines every draft: a probe is 16 steps of lookups that buy nothing, it fails
    # and the wait before the next one doubles (128, 256, 512 steps)
    chosen = drive_declining(c, 1000, spec_rate=300, drafted_every=10**9)
    assert not c.on and c.switches_on == 0
    assert sum(chosen) == 16 * 3
    # drafts that pay, verified in 1 step of 8: with the declined ones, 16 steps beat plain decoding
    drive_declining(c, 1200, spec_rate=300, drafted_every=8)
    assert c.on and c.switches_on == 1 and not c.snapshot()["by_batch"]["1"]["probing"]
    # and where the declined steps' cost outweighs the drafts' gain, speculation goes off again
    drive_declining(c, 400, spec_rate=100, drafted_every=8, declined_rate=80)
    assert not c.on and c.switches_off == 2


def test_controller_keeps_speculation_on_where_it_pays_and_keeps_a_baseline():
    c = Controller(probe_every=16)
    chosen = drive(c, 320, spec_rate=150, plain_rate=90)
    assert c.on and c.switches_off == 0
    assert 20 <= chosen.count(False) <= 40  # the plain baseline keeps being measured (1 in 4, then 1 in 16)


def test_steps_whose_plan_declined_keep_the_baseline_without_plain_steps():
    c = Controller(probe_every=16)
    drive(c, 80, spec_rate=150, plain_rate=90)  # a baseline of forced plain steps to begin with
    chosen = []
    for n in range(320):  # a copying answer: the plan declines in one step of 10
        spec = c.speculate(1)
        chosen.append(spec)
        declined = spec and n % 10 == 0
        c.record(1, spec, 1.0 / (89 if declined else 150 if spec else 90), 1, 1.0 / 91 if declined else None)
    assert chosen.count(False) == 0  # each declined step's time less the lookups' was a plain sample
    assert c.on and 90 < c.snapshot()["by_batch"]["1"]["plain_tok_s"] < 91
    for n in range(64):  # drafts in every step again: plain steps come back, one in 16
        spec = c.speculate(1)
        chosen.append(spec)
        c.record(1, spec, 1.0 / (150 if spec else 90), 1)
    assert chosen[-64:].count(False) == 4


def test_controller_judges_each_batch_size_on_its_own():
    c = Controller()
    drive(c, 80, spec_rate=150, plain_rate=90, batch=1)
    drive(c, 80, spec_rate=100, plain_rate=200, batch=4)
    assert c.snapshot()["by_batch"]["1"]["on"] and not c.snapshot()["by_batch"]["4"]["on"]


def test_a_new_request_cuts_the_wait_of_a_controller_that_is_off():
    c = Controller(probe_every=16, probe_steps=16, reprobe_after=64)
    drive(c, 64, spec_rate=60, plain_rate=90)
    drive(c, 400, spec_rate=60, plain_rate=90)  # failed probes: the wait has grown
    assert not c.on and drive(c, 20, spec_rate=60, plain_rate=90) == [False] * 20
    c.new_request()
    assert drive(c, 16, spec_rate=60, plain_rate=90) == [True] * 16  # a probe, at once
    assert not c.on


def test_the_guard_stops_drafts_of_a_lone_sequence_whose_steps_lose():
    h = HistoryIndex(None)
    h.add(list(range(100, 140)))
    spec = Speculator(SpeculativeConfig(sources=["history"]), history=h)
    for _ in range(20):  # plain steps of the model: 100 tokens per second; extra rows cheap
        for rows in range(1, 7):
            spec.cost.observe(rows, 0.010 + 0.0005 * (rows - 1))
            spec.costs.observe(2, 2 * rows, 0.011 + 0.0005 * (2 * rows - 1))  # two sequences' decodes
        spec.controller.record(1, False, 0.010, 1)
    losing, paying = spec.new_sequence([1, 100, 101]), spec.new_sequence([2, 100, 101])
    for n in range(1, 9):
        spec.lone_step(losing, 0.015, 1)  # 67 tokens per second
        spec.lone_step(paying, 0.015, 3)  # 200
        assert losing.pause == (16 if n == 8 else 0) and paying.pause == 0
    spec.propose([(0, losing, 4), (1, paying, 4)], 2)  # in a batch the guard does not act (nor count)
    assert losing.pending and paying.pending and losing.pause == 16
    for _ in range(16):
        spec.propose([(0, losing, 4)], 1)
        assert losing.pending == []
    spec.propose([(0, losing, 4)], 1)
    assert losing.pending  # the pause is over
    for _ in range(4):  # judged again 4 steps on, and losing still: a pause twice as long
        spec.lone_step(losing, 0.015, 1)
    assert losing.pause == 32 and spec.stats["guard_pauses"] == 2


@pytest.mark.parametrize("spec,expected", [
    ({"sources": ["ngram", "lookahead"]}, 'models[0].speculative.sources[1]: expected one of draft_model, history, ngram, got "lookahead"'),
    ({"sources": ["ngram", "ngram"]}, "models[0].speculative.sources: each source may appear once"),
    ({"sources": ["draft_model"]}, "models[0].speculative.draft_model: required when sources lists draft_model"),
    ({"min_draft": 8, "max_draft": 4}, "models[0].speculative.min_draft: 8 must not exceed max_draft (4)"),
    ({"max_draft": 0}, "models[0].speculative.max_draft: expected int >= 1 and <= 64, got 0"),
    ({"drafts": 3}, "models[0].speculative.drafts: unknown key (allowed: draft_model, history_tokens, max_draft, min_draft, sources)"),
])
def test_speculative_config_errors_name_the_key(spec, expected):
    with pytest.raises(ConfigError) as e:
        parse_config({"models": [{"name": "m", "path": "m.gguf", "speculative": spec}]})
    assert any(p.startswith(expected) for p in e.value.problems), e.value.problems


def test_model_speculative_settings_overlay_the_inference_defaults():
    cfg = parse_config({
        "inference": {"speculative": {"sources": ["ngram", "draft_model"], "draft_model": "small", "max_draft": 8}},
        "models": [{"name": "big", "path": "b.gguf", "speculative": {"max_draft": 4}}, {"name": "small", "path": "s.gguf"}],
    })
    big = cfg.models[0].speculative
    assert big.sources == ["ngram", "draft_model"] and big.max_draft == 4 and big.draft_model == "small"
    assert cfg.draft_path(cfg.models[0]) == cfg.model_path(cfg.models[1])  # a configured model's file
    with pytest.raises(ConfigError) as e:
        parse_config({"inference": {"speculative": {"sources": ["history"], "min_draft": 20}},
                      "models": [{"name": "m", "path": "m.gguf"}]})
    assert e.value.problems == ["models[0].speculative.min_draft: 20 must not exceed max_draft (16)"]


def test_a_step_with_drafts_stays_under_the_batch_invariant_rows():
    # four greedy sequences with room for 16 drafts each would make a 68-row decode, where the
    # K-quant kernels sum in another order (patch 0004's threshold): the runner shares 63 rows
    from types import SimpleNamespace

    from appliance.engine.runner import ModelRunner
    from appliance.engine.speculative.exactness import BATCH_INVARIANT_ROWS

    jobs: list = []
    spec = SimpleNamespace(exact_rows=17, propose=lambda js, base: jobs.extend(js))
    runner = SimpleNamespace(batch_cap=512, outputs_cap=63, cfg=SimpleNamespace(n_ctx=4096), spec=spec)
    seqs = [SimpleNamespace(seq_id=i, spec=None, rng=None, pos=100, n_generated=0,
                            req=SimpleNamespace(max_tokens=1000)) for i in range(4)]
    ModelRunner._propose(runner, seqs, seqs)
    rooms = [room for _, _, room in jobs]
    assert BATCH_INVARIANT_ROWS == 64 and rooms == [14, 14, 14, 14]  # (63 - 4) // 4
    assert len(seqs) + sum(rooms) < BATCH_INVARIANT_ROWS
    jobs.clear()
    ModelRunner._propose(runner, seqs[:1], seqs[:1])  # one sequence: its exact width decides
    assert [room for _, _, room in jobs] == [16]
    jobs.clear()
    runner.outputs_cap = 12  # the context's n_outputs_max: a decode asking for more rows aborts llama.cpp
    ModelRunner._propose(runner, seqs, seqs)
    assert [room for _, _, room in jobs] == [2, 2, 2, 2]  # (12 - 4) // 4


def test_the_logits_rows_a_context_reserves_cover_every_decode_the_runner_makes():
    from appliance.config import parse_config
    from appliance.resources.outputs import max_outputs

    def cap(**model) -> int:
        entry = {"name": "m", "path": "m.gguf", "n_parallel": 4, "n_batch": 512, **model}
        return max_outputs(parse_config({"models": [entry]}).models[0])

    assert cap() == 4  # no speculation: one row per sequence
    assert cap(speculative={"sources": ["ngram"]}) == 63  # a step's rows stay under 64 (patch 0004)
    assert cap(n_parallel=1, speculative={"sources": ["ngram"]}) == 17  # one sequence, 16 drafts
    # the exactness probe decodes max_draft + 1 rows of one sequence
    assert cap(n_parallel=1, speculative={"sources": ["ngram"], "max_draft": 64}) == 65
    assert cap(n_parallel=100, n_batch=64, speculative={"sources": ["ngram"]}) == 100  # at least a row each
    assert cap(n_batch=32, speculative={"sources": ["ngram"]}) == 32  # never beyond the batch
    assert cap(scoring_rows=48) == 48  # a scored prompt's chunk: a row per token
    assert cap(scoring_rows=2, speculative={"sources": ["ngram"]}) == 63
    assert cap(scoring_rows=1000) == 512


def test_decode_costs_are_kept_per_number_of_sequences():
    """Two sequences' decodes do not set what a lone sequence's draft costs: pooled, the slow
    two-sequence decodes at the end of a batched run made the lone plan avoid single drafts."""
    spec = Speculator(SpeculativeConfig(sources=["ngram"]))
    for _ in range(12):
        for rows in range(1, 6):
            spec.costs.observe(1, rows, 0.005 + 0.0007 * (rows - 1))  # one sequence and its drafts
        spec.costs.observe(2, 2, 0.011)  # two sequences, a token each: dearer
    assert spec.cost.time(2) == pytest.approx(0.0057, rel=0.05)
    assert spec.costs.of(2).time(2) == pytest.approx(0.011, rel=0.05)
    st = spec.new_sequence([5, 6, 7, 8, 9, 5, 6, 7])  # a repeat: drafts of 1-3 tokens are likely
    for _ in range(20):
        spec.accept["ngram:3"].update(4, 4)
    spec.propose([(0, st, 1)], 1)  # room for one draft: it pays at the lone sequence's cost
    assert st.pending == [8]
    snap = spec.snapshot()
    assert set(snap["step_ms_by_sequences"]) == {"1", "2"} and snap["step_ms_by_rows"] == snap["step_ms_by_sequences"]["1"]
    # the plan counts a switch from the context's last width (`costs.previous`), whatever set it
    spec.costs.of(1).switch_up = 0.05  # going wider costs far more than a draft brings
    spec.costs.previous = 1
    st.pending = []
    spec.propose([(0, st, 1)], 1)
    assert st.pending == []
    spec.costs.previous = 2  # a two-sequence decode, as wide as the draft's step: nothing to switch
    spec.propose([(0, st, 1)], 1)
    assert st.pending == [8]


def test_a_prediction_drafts_its_beginning_then_what_follows_the_answers_end():
    p = PredictionLookup(PredictionIndex([10, 11, 12, 13, 14, 15]))
    assert p.lookup([], 3) == ([10, 11, 12], MATCH_CAP)
    assert p.lookup([10, 11], 3) == ([12, 13, 14], 2)
    assert p.lookup([99, 13], 5) == ([14, 15], 1)  # resynchronised by the last token
    assert p.lookup([98, 99], 3) == ([], 0)  # nothing predicted follows
    assert p.lookup([10, 11], 0) == ([], 0)


def test_a_repeated_part_of_the_prediction_is_taken_at_or_after_the_last_match():
    p = PredictionLookup(PredictionIndex([1, 2, 3, 1, 2, 4, 1, 2, 5]))
    assert p.lookup([1, 2], 1) == ([3], 2)  # the first occurrence
    assert p.lookup([1, 2, 3, 1, 2], 1) == ([4], 5)  # its match reaches back: the second
    assert p.lookup([7, 1, 2], 1) == ([4], 2)  # at or after the last match


def test_sequences_sharing_a_prediction_follow_it_apart():
    index = PredictionIndex([1, 2, 3, 1, 2, 4])
    first, second = PredictionLookup(index), PredictionLookup(index)
    assert first.lookup([1, 2, 3, 1, 2], 1) == ([4], 5)
    assert second.lookup([1, 2], 1) == ([3], 2)  # its own cursor: still at the start
