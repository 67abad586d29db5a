"""Speculative decoding's pieces on their own: the rejection rule (statistically, fixed seed),
prompt lookup, the history index and its file, draft lengths, the controller, config errors."""

from __future__ import annotations

import numpy as np
import pytest

from appliance.config import ConfigError, parse_config
from appliance.engine.speculative.controller import Controller, DraftLength
from appliance.engine.speculative.history import HistoryIndex
from appliance.engine.speculative.ngram import NgramIndex
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


def test_history_index_is_bounded_and_ignores_a_foreign_file(tmp_path):
    h = HistoryIndex(None, max_tokens=300)
    for i in range(10):
        h.add(list(range(i * 100, i * 100 + 100)))
    assert h.n_tokens <= 300
    assert h.lookup([901, 902], 2) == [903, 904] and h.lookup([1, 2], 2) == []  # the oldest are gone
    bad = tmp_path / "x.history"
    bad.write_bytes(b"not a history")
    assert HistoryIndex(bad).n_tokens == 0


def test_draft_length_grows_on_acceptance_and_shrinks_on_rejection():
    d = DraftLength(2, 16)
    d.update(2, 2)
    assert d.k == 4
    d.update(4, 4)
    d.update(8, 8)
    d.update(16, 16)
    assert d.k == 16
    d.update(16, 3)
    assert d.k == 4
    d.update(4, 0)
    assert d.k == 2


def drive(c: Controller, steps: int, spec_rate: float, plain_rate: float, batch: int = 1) -> list[bool]:
    """Run the controller over steps whose tokens per second are given; what it chose each step."""
    chosen = []
    for _ in range(steps):
        spec = c.speculate(batch)
        chosen.append(spec)
        c.record(batch, spec, 1.0 / (spec_rate if spec else plain_rate), 1)
    return chosen


def test_controller_turns_speculation_off_where_it_does_not_pay_and_probes_again():
    c = Controller(probe_every=16, probe_steps=8, reprobe_after=64)
    drive(c, 40, spec_rate=60, plain_rate=90)
    assert not c.on and c.switches_off == 1
    chosen = drive(c, 200, spec_rate=60, plain_rate=90)
    assert 0 < sum(chosen) < 40  # it still samples speculation now and then, with growing waits
    drive(c, 400, spec_rate=200, plain_rate=90)  # the workload changed: speculation pays again
    assert c.on and c.switches_on >= 1


def test_controller_keeps_speculation_on_where_it_pays_and_keeps_a_baseline():
    c = Controller(probe_every=16)
    chosen = drive(c, 320, spec_rate=150, plain_rate=90)
    assert c.on and c.switches_off == 0
    assert 10 <= chosen.count(False) <= 30  # the plain baseline keeps being measured


def test_controller_judges_each_batch_size_on_its_own():
    c = Controller()
    drive(c, 60, spec_rate=150, plain_rate=90, batch=1)
    drive(c, 60, spec_rate=100, plain_rate=200, batch=4)
    assert c.snapshot()["by_batch"]["1"]["on"] and not c.snapshot()["by_batch"]["4"]["on"]


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
