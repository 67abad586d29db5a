"""Request seeds as llama.cpp's 32-bit ones: never its "random seed" value (a request seeded
2^32-1, -1, or a later sample of one that wrapped there, drew differently each time), distinct
seeds stay distinct (0 and 2^32 drew the same), and a request's samples do not share seeds with
the next seed's (seed + k made seed 0's second sample seed 1's first)."""

from __future__ import annotations

from appliance.engine.sampling import RANDOM_SEED, SamplingParams, seed32, with_seed_offset


def test_a_seed_in_llama_cpps_range_is_itself():
    for seed in (0, 1, 42, 2**31, RANDOM_SEED - 1):
        assert seed32(seed) == seed


def test_no_seed_becomes_the_random_one_and_none_collide_by_wrapping():
    seeds = [RANDOM_SEED, -1, -2, 2**32, 2**32 + 1, 2**63 - 1, -(2**63)]
    mapped = [seed32(s) for s in seeds]
    assert all(0 <= m < RANDOM_SEED for m in mapped)
    assert len(set(mapped) | {0, 1}) == len(seeds) + 2  # none is another's, nor 0's or 1's
    assert seed32(RANDOM_SEED) == seed32(RANDOM_SEED)  # the same every time


def test_samples_of_a_request_draw_apart_from_the_next_seeds():
    firsts = {seed32(s) for s in range(100)}
    later = [with_seed_offset(SamplingParams(seed=seed32(s)), k).seed for s in range(100) for k in (1, 2, 3)]
    assert not firsts & set(later) and len(set(later)) == len(later)
    assert all(0 <= s < RANDOM_SEED for s in later)
    assert with_seed_offset(SamplingParams(seed=5), 0).seed == 5
