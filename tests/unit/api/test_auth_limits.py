from __future__ import annotations

import statistics
import time

import pytest

from appliance.api.auth import KeyFileError, KeyRing, key_line, read_key_file
from appliance.api.limits import KeyLimits, LimitExceeded


def test_key_file_holds_digests_and_roles(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# ops keys\n" + key_line("alice", "alice-secret-1") + "\n"
                    + key_line("ops", "ops-secret-123", "admin") + "\n\n")
    assert "alice-secret-1" not in path.read_text()
    ring = KeyRing(["config-key-1"], [], read_key_file(path))
    assert ring.match("alice-secret-1").id == "alice" and not ring.match("alice-secret-1").admin
    assert ring.match("ops-secret-123").admin
    # an admin key exists, so plain config keys are not admin
    assert ring.match("config-key-1") is not None and not ring.match("config-key-1").admin
    assert ring.match("alice-secret-2") is None


def test_api_keys_are_admin_when_no_admin_key_exists():
    ring = KeyRing(["only-key-1"], [])
    assert ring.match("only-key-1").admin
    assert KeyRing([], []).open


def test_a_malformed_key_file_names_the_line(tmp_path):
    path = tmp_path / "keys"
    path.write_text(key_line("a", "aaaaaaaa") + "\nbob user plaintext-key\n")
    with pytest.raises(KeyFileError, match=r"keys:2"):
        read_key_file(path)


def test_wrong_key_timing_does_not_depend_on_the_matched_prefix():
    """Keys are compared as SHA-256 digests with compare_digest: a wrong key sharing 31 of 32
    characters with the real one takes as long as one sharing none."""
    real = "k" * 32
    ring = KeyRing([real], [])
    near = "k" * 31 + "x"
    far = "x" * 32

    def once(token: str) -> int:
        t0 = time.perf_counter_ns()
        for _ in range(1000):
            ring.match(token)
        return time.perf_counter_ns() - t0

    once(near), once(far)  # warm up
    samples: dict[str, list[int]] = {"near": [], "far": []}
    for _ in range(15):  # interleaved, so load from other processes hits both alike
        samples["near"].append(once(near))
        samples["far"].append(once(far))
    a, b = statistics.median(samples["near"]), statistics.median(samples["far"])
    assert abs(a - b) / min(a, b) < 0.2, (a, b)


def test_rate_limit_refills_and_names_the_wait():
    now = [0.0]
    lim = KeyLimits(rate_per_minute=2, concurrent=None, clock=lambda: now[0])
    lim.acquire("k"); lim.release("k")
    lim.acquire("k"); lim.release("k")
    with pytest.raises(LimitExceeded) as e:
        lim.acquire("k")
    assert e.value.limit == "rate_per_minute" and e.value.retry_after == 30
    lim.acquire("other")  # per key
    now[0] = 30.0
    lim.acquire("k")


def test_concurrency_limit_counts_until_release():
    lim = KeyLimits(rate_per_minute=None, concurrent=2)
    lim.acquire("k")
    lim.acquire("k")
    with pytest.raises(LimitExceeded) as e:
        lim.acquire("k")
    assert e.value.limit == "concurrent_requests"
    lim.release("k")
    lim.acquire("k")


def test_keys_are_compared_as_digests_against_every_key(monkeypatch):
    """What makes the timing flat: fixed-length SHA-256 digests go to compare_digest, for every
    known key, also after a match (a plain == on the keys would stop at the first difference)."""
    import appliance.api.auth as auth

    calls = []
    real = auth.hmac.compare_digest
    monkeypatch.setattr(auth.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or real(a, b))
    ring = KeyRing(["first-key-1", "second-key-2", "third-key-33"], [])
    assert ring.match("first-key-1") is not None
    assert len(calls) == 3 and all(len(a) == len(b) == 32 for a, b in calls)
    calls.clear()
    assert ring.match("x") is None and len(calls) == 3
