"""GET /metrics: Prometheus families for requests, tokens, latency, the engine and the devices.

Request-side families are counted as requests end (see `Metrics.observe_request`) and as
sequence events pass (`Metrics.tap`, a Generations tap: time to first token, inter-token
latency, tokens). Engine-side families are read from the manager and its runners at scrape time
(`EngineCollector`); a runner's counters start again at each load, so the collector carries the
totals of the runners it has seen replaced and the exported counters only grow.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .context import RequestInfo

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12)
CONTENT_TYPE = CONTENT_TYPE_LATEST

# runner.stats key -> (family, help); the speculative ones come from runner.speculative_stats().
RUNNER_COUNTERS = {
    "prefill_tokens": ("eie_prefill_tokens", "Prompt tokens prefilled (not restored from the prefix cache)"),
    "decode_tokens": ("eie_decode_tokens", "Tokens decoded"),
    "sequences": ("eie_sequences", "Sequences admitted to a slot"),
    "prefix_misses": ("eie_prefix_cache_misses", "Prompts that found no cached prefix"),
    "prefix_tokens_restored": ("eie_prefix_cache_restored_tokens", "Prompt tokens restored from the prefix cache"),
    "grammar_sequences": ("eie_grammar_sequences", "Sequences whose output follows a grammar (response_format, grammar)"),
    "grammar_dead_ends": ("eie_grammar_dead_ends", "Constrained answers ended because the grammar allowed no next token"),
    "prompt_tokens_scored": ("eie_prompt_scored_tokens", "Prompt tokens prefilled with their logits kept to score the prompt (echo with logprobs)"),
    "embedded_inputs": ("eie_embedded_inputs", "Inputs pooled into embeddings (/v1/embeddings)"),
    "reasoning_budget_cuts": ("eie_reasoning_budget_cuts", "Think blocks closed by the server when their reasoning budget was spent"),
    "kv_migrations": ("eie_kv_type_changes", "KV cache type changes (adaptive or requested)"),
    "kv_migration_reverts": ("eie_kv_type_change_reverts", "KV type changes whose new context could not be made, the old types put back"),
    "background_preemptions": ("eie_background_preemptions", "Background (batch) sequences parked to give their slot to an interactive request"),
    "background_parks_declined": ("eie_background_parks_declined", "Background (batch) sequences left in their slot because the host had no memory for their state (the interactive request waited)"),
    "adapter_switches": ("eie_lora_adapter_switches", "Decodes that changed the context's LoRA adapters (models[].lora; each makes llama.cpp reserve its graph again)"),
    "speculative_drafted": ("eie_speculative_drafted_tokens", "Draft tokens proposed by speculative decoding"),
    "speculative_accepted": ("eie_speculative_accepted_tokens", "Draft tokens accepted by the verifier"),
}
PREFIX_TIERS = ("live", "ram", "disk")
# manager.model_counters kind -> family
MODEL_EVENTS = {
    "load": ("eie_model_loads", "Model loads that succeeded"),
    "load_failed": ("eie_model_load_failures", "Model loads that failed"),
    "eviction": ("eie_model_evictions", "Models evicted by the strategy (memory or keep-alive)"),
    "unload": ("eie_model_unloads", "Models unloaded on request"),
}


class EngineCollector:
    """Reads the manager at scrape time (called from a worker thread, never the event loop)."""

    def __init__(self, manager: Any, devices: Callable[[], list] | None = None, extra: Callable[[], dict] | None = None):
        self.manager = manager
        self.devices = devices
        self.extra = extra or (lambda: {})
        self._runners: dict[str, Any] = {}
        self._carry: dict[tuple[str, str], float] = {}

    def _stats(self, name: str, runner: Any) -> dict[str, float]:
        old = self._runners.get(name)
        if old is not None and old is not runner:
            for key, value in self._runner_counts(old).items():
                self._carry[(name, key)] = self._carry.get((name, key), 0) + value
        self._runners[name] = runner
        now = self._runner_counts(runner)
        keys = set(now) | {k for (m, k) in self._carry if m == name}
        return {k: now.get(k, 0) + self._carry.get((name, k), 0) for k in keys}

    @staticmethod
    def _runner_counts(runner: Any) -> dict[str, float]:
        counts = {k: v for k, v in dict(runner.stats).items() if isinstance(v, (int, float))}
        spec = runner.speculative_stats() if runner.state == "ready" else None
        if spec:
            counts["speculative_drafted"] = spec.get("drafted", 0)
            counts["speculative_accepted"] = spec.get("accepted", 0)
        return counts

    def collect(self) -> Iterator[Metric]:
        m = self.manager
        queue = GaugeMetricFamily("eie_queue_depth", "Requests waiting for a sequence slot", labels=["model"])
        running = GaugeMetricFamily("eie_running_sequences", "Sequences in a slot now", labels=["model"])
        slots = GaugeMetricFamily("eie_sequence_slots", "Sequence slots (n_parallel)", labels=["model"])
        state = GaugeMetricFamily("eie_model_state", "1 for the model's current state", labels=["model", "state"])
        kv = GaugeMetricFamily("eie_kv_cache_bytes", "KV cache buffer size, with its K and V types",
                               labels=["model", "type_k", "type_v"])
        mem = GaugeMetricFamily("eie_model_memory_bytes", "Measured model buffers", labels=["model", "kind"])
        prefix_bytes = GaugeMetricFamily("eie_prefix_cache_bytes", "Saved prefixes held", labels=["model", "tier"])
        parked = GaugeMetricFamily("eie_background_parked_bytes",
                                   "KV state of parked background (batch) sequences, held in host memory",
                                   labels=["model"])
        spec_on = GaugeMetricFamily("eie_speculative_on", "1 when the controller has speculative decoding on",
                                    labels=["model"])
        disk = {k: CounterMetricFamily(f"eie_prefix_cache_disk_{k}", h, labels=["model"]) for k, h in
                (("writes", "Saved prefixes written to the disk tier"),
                 ("errors", "Disk tier failures (the tier turns off for the model; see /v1/admin/kv/status)"))}
        hits = CounterMetricFamily("eie_prefix_cache_hits", "Prompts that reused a cached prefix, per tier",
                                   labels=["model", "tier"])
        counters = {k: CounterMetricFamily(f, h, labels=["model"]) for k, (f, h) in RUNNER_COUNTERS.items()}
        events = {k: CounterMetricFamily(f, h, labels=["model"]) for k, (f, h) in MODEL_EVENTS.items()}
        model_counters = getattr(m, "model_counters", {})
        for name, r in list(m.runners.items()):
            stats = self._stats(name, r)
            queue.add_metric([name], r.queue_depth() if r.state == "ready" else 0)
            parked.add_metric([name], r.background_counts()["parked_bytes"] if r.state == "ready" else 0)
            running.add_metric([name], r.running() if r.state == "ready" else 0)
            slots.add_metric([name], r.cfg.n_parallel)
            state.add_metric([name, r.state], 1)
            loaded = r.loaded
            if loaded is not None:
                b = loaded.buffers
                kv.add_metric([name, *r.kv_types], b.kv)  # the live types (adaptive KV changes them)
                for kind, value in (("weights", b.weights), ("kv", b.kv), ("compute", b.compute + b.output)):
                    mem.add_metric([name, kind], value)
            if r.prefix is not None:
                prefix_bytes.add_metric([name, "ram"], r.prefix.store.ram_used)
                prefix_bytes.add_metric([name, "disk"], getattr(r.prefix.store, "_disk_used", 0))
                store_stats = getattr(r.prefix.store, "stats", {})
                for k, fam in disk.items():
                    fam.add_metric([name], store_stats.get(f"disk_{k}", 0))
            for tier in PREFIX_TIERS:
                hits.add_metric([name, tier], stats.get(f"prefix_{tier}_hits", 0))
            for key, fam in counters.items():
                fam.add_metric([name], stats.get(key, 0))
            for kind, fam in events.items():
                fam.add_metric([name], model_counters.get((name, kind), 0))
            spec = r.speculative_stats() if r.state == "ready" else None
            if spec is not None:
                spec_on.add_metric([name], 1 if spec.get("controller_on") else 0)
        yield from (queue, running, slots, state, kv, mem, prefix_bytes, hits, *disk.values(), *counters.values(),
                    *events.values(), spec_on, parked)
        if self.devices is not None:
            dev = GaugeMetricFamily("eie_device_memory_bytes", "Device memory", labels=["device", "kind", "state"])
            for d in self.devices():
                for st, value in (("total", d.total_bytes), ("used", d.used_bytes), ("free", d.free_bytes)):
                    dev.add_metric([d.device, d.kind, st], value)
            yield dev
        for family, (help_text, value) in self.extra().items():
            g = GaugeMetricFamily(family, help_text) if not family.endswith("_total") else \
                CounterMetricFamily(family[: -len("_total")], help_text)
            g.add_metric([], value)
            yield g


class Metrics:
    def __init__(self, manager: Any, devices: Callable[[], list] | None = None,
                 extra: Callable[[], dict] | None = None):
        r = self.registry = CollectorRegistry(auto_describe=False)
        self.requests = Counter("eie_requests", "HTTP requests by endpoint, model and status",
                                ["endpoint", "model", "status"], registry=r)
        self.request_seconds = Histogram("eie_request_duration_seconds", "Time to the end of the response",
                                         ["endpoint"], buckets=LATENCY_BUCKETS, registry=r)
        self.prompt_tokens = Counter("eie_prompt_tokens", "Prompt tokens of ended sequences (finished, cancelled "
                                     "or failed: as far as they were prefilled)", ["model"], registry=r)
        self.generated_tokens = Counter("eie_generated_tokens", "Tokens generated by ended sequences (finished, "
                                        "cancelled or failed)", ["model"], registry=r)
        self.ttft = Histogram("eie_time_to_first_token_seconds", "From submit to a sequence's first text", ["model"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("eie_inter_token_latency_seconds", "Between a sequence's successive texts", ["model"],
                             buckets=TOKEN_GAP_BUCKETS, registry=r)
        self.sequences_ended = Counter("eie_sequences_ended", "Sequences by how they ended", ["model", "reason"],
                                       registry=r)
        self.group_executions = Counter("eie_group_executions", "Group executions by outcome", ["group", "outcome"],
                                        registry=r)
        self.group_fallbacks = Counter("eie_group_fallbacks", "Group members that needed their fallback",
                                       ["group", "fallback"], registry=r)
        self.refused = Counter("eie_limit_refusals", "Requests refused by a limit", ["limit"], registry=r)
        r.register(EngineCollector(manager, devices, extra))
        # process_resident_memory_bytes, process_cpu_seconds_total, open fds, start time: what
        # every Prometheus exporter has, and the RSS a budget's models add up to
        ProcessCollector(registry=r)

    def tap(self, gens: Any, i: int, ev: Any, first: bool, seconds: float) -> None:
        """A Generations tap (engine/client.py)."""
        model = gens.runner.name
        kind = type(ev).__name__
        if kind == "TextDelta":
            (self.ttft if first else self.itl).labels(model).observe(seconds)
        elif kind == "Finished":
            self.prompt_tokens.labels(model).inc(ev.prompt_tokens)
            self.generated_tokens.labels(model).inc(ev.completion_tokens)
            self.sequences_ended.labels(model, ev.reason).inc()
        elif kind == "Failed":
            self.prompt_tokens.labels(model).inc(ev.prompt_tokens)
            self.generated_tokens.labels(model).inc(ev.completion_tokens)
            self.sequences_ended.labels(model, ev.kind).inc()

    def observe_request(self, info: RequestInfo, endpoint: str) -> None:
        status = str(info.status or 0)
        # one HTTP request counts once: a group's under its name (its members answered it)
        model = info.group or (info.models[0] if info.models else "")
        self.requests.labels(endpoint, model, status).inc()
        self.request_seconds.labels(endpoint).observe(info.seconds())

    def observe_group(self, group: str, result: Any) -> None:
        """A GroupResult: its outcome, and each member that fell back."""
        if result.failed:
            outcome = "failed"
        elif result.complete:
            outcome = "complete"
        else:
            outcome = "partial"
        self.group_executions.labels(group, outcome).inc()
        for member in result.members:
            if member.attempts > 1:  # retried, or run again on the replacement (answered or not)
                self.group_fallbacks.labels(group, result.fallback).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
