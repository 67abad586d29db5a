"""The engine collector: counters that survive a runner being replaced, optional families that
light up when the runner reports them (speculative decoding)."""

from __future__ import annotations

from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from appliance.observability.context import RequestInfo
from appliance.observability.metrics import Metrics


def runner(name: str, spec: dict | None = None, **stats) -> SimpleNamespace:
    base = {"sequences": 0, "prefill_tokens": 0, "decode_tokens": 0, "prefix_live_hits": 0, "prefix_ram_hits": 0,
            "prefix_disk_hits": 0, "prefix_misses": 0, "prefix_tokens_restored": 0, "kv_migrations": 0}
    return SimpleNamespace(name=name, state="ready", stats={**base, **stats}, loaded=None, prefix=None,
                           cfg=SimpleNamespace(n_parallel=4), kv_types=("f16", "f16"),
                           queue_depth=lambda: 3, running=lambda: 2, speculative_stats=lambda: spec,
                           background_counts=lambda: {"running": 1, "queued": 0, "parked": 1, "parked_bytes": 4096})


def values(m: Metrics) -> dict[tuple[str, tuple], float]:
    out = {}
    for fam in text_string_to_metric_families(m.render().decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_counters_only_grow_when_a_runner_is_replaced():
    manager = SimpleNamespace(runners={"a": runner("a", decode_tokens=100, prefix_ram_hits=2)},
                              model_counters={("a", "load"): 1})
    m = Metrics(manager)
    v = values(m)
    assert v[("eie_decode_tokens_total", (("model", "a"),))] == 100
    assert v[("eie_queue_depth", (("model", "a"),))] == 3
    assert v[("eie_running_sequences", (("model", "a"),))] == 2
    assert v[("eie_background_parked_bytes", (("model", "a"),))] == 4096
    manager.runners["a"].stats["decode_tokens"] = 150
    manager.runners["a"] = runner("a", decode_tokens=10)  # reloaded: a new runner starts from 0
    manager.model_counters[("a", "load")] = 2
    v = values(m)
    assert v[("eie_decode_tokens_total", (("model", "a"),))] == 160
    assert v[("eie_prefix_cache_hits_total", (("model", "a"), ("tier", "ram")))] == 2
    assert v[("eie_model_loads_total", (("model", "a"),))] == 2


def test_speculative_families_come_from_the_runners_speculative_stats():
    spec = {"drafted": 40, "accepted": 31, "controller_on": True}
    manager = SimpleNamespace(runners={"a": runner("a"), "b": runner("b", spec)})
    v = values(Metrics(manager))
    assert v[("eie_speculative_drafted_tokens_total", (("model", "a"),))] == 0
    assert v[("eie_speculative_drafted_tokens_total", (("model", "b"),))] == 40
    assert v[("eie_speculative_accepted_tokens_total", (("model", "b"),))] == 31
    assert v[("eie_speculative_on", (("model", "b"),))] == 1
    assert ("eie_speculative_on", (("model", "a"),)) not in v  # does not speculate


def test_requests_and_groups_are_counted_with_their_labels():
    m = Metrics(SimpleNamespace(runners={}))
    info = RequestInfo("r", "POST", "/v1/batch/execute", status=200, models=["a", "b"], group="g")
    m.observe_request(info, "/v1/batch/execute")  # once, under the group's name
    m.observe_request(RequestInfo("s", "POST", "/v1/chat/completions", status=200, models=["b"]), "/v1/chat/completions")
    member = lambda status, attempts=1: SimpleNamespace(status=status, attempts=attempts)  # noqa: E731
    # each member run again counts under the group's fallback: a replacement that failed too is
    # still replace_with (it was counted as retry_once)
    m.observe_group("g", SimpleNamespace(failed=False, complete=False, fallback="replace_with",
                                         members=[member("ok"), member("replaced", 2), member("failed", 2)]))
    m.observe_group("r", SimpleNamespace(failed=False, complete=True, fallback="retry_once",
                                         members=[member("ok"), member("ok", 2)]))
    v = values(m)
    assert v[("eie_requests_total", (("endpoint", "/v1/batch/execute"), ("model", "g"), ("status", "200")))] == 1
    assert ("eie_requests_total", (("endpoint", "/v1/batch/execute"), ("model", "b"), ("status", "200"))) not in v
    assert v[("eie_requests_total", (("endpoint", "/v1/chat/completions"), ("model", "b"), ("status", "200")))] == 1
    assert v[("eie_group_executions_total", (("group", "g"), ("outcome", "partial")))] == 1
    assert v[("eie_group_fallbacks_total", (("fallback", "replace_with"), ("group", "g")))] == 2
    assert ("eie_group_fallbacks_total", (("fallback", "retry_once"), ("group", "g"))) not in v
    assert v[("eie_group_fallbacks_total", (("fallback", "retry_once"), ("group", "r")))] == 1


def test_process_families_are_exported():
    """process_resident_memory_bytes and the other standard process families (prometheus_client's
    ProcessCollector) come with the engine's."""
    m = Metrics(SimpleNamespace(runners={}))
    got = values(m)
    assert got[("process_resident_memory_bytes", ())] > 0
    assert ("process_cpu_seconds_total", ()) in got and ("process_open_fds", ()) in got
