"""`kv_cache.mode: auto`: the least compressed KV type with which every model fits the budget.

Pure: the model manager hands in the configured models, their GGUF shapes and the usable bytes
(the budget up to its low watermark) and gets one KvChoice per model, with a sentence saying why.

The ladder is f16 → q8_0 → turbo4 → turbo3 → turbo2 (f16 → q8_0 → q4_0 where TurboQuant cannot
run: a GPU build that offloads, or a llama.cpp without the types). All auto models start at f16;
while the estimate of all models together exceeds the usable bytes, the auto model with the
largest KV cache steps one rung down; then, in config order, each steps back up while everything
still fits. Explicit types never change. On a GPU a model counts what it puts there (its
offloaded layers with their KV, the compute buffer, a draft model: resources/offload.py), as the
GPU's budget charges it; `n_gpu_layers: auto` counts as every layer, so auto compresses the KV
before a model would run partly on the CPU. K follows V, except that a
model with GQA ≥ 6 (n_head / n_head_kv) keeps K at q8_0 past q8_0 (with few KV heads each K error
reaches many query heads), and a configured `k` is kept as it is.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import ModelConfig
from . import offload
from .estimate import GgufShape, estimate

LADDER = ("f16", "q8_0", "turbo4", "turbo3", "turbo2")
LADDER_NO_TURBO = ("f16", "q8_0", "q4_0")
TURBO_TYPES = frozenset({"turbo4", "turbo3", "turbo2"})
# From this GQA ratio on, K stays at q8_0 while V steps further down.
GQA_KEEP_K = 6


@dataclass(frozen=True)
class KvInput:
    cfg: ModelConfig  # as configured (inference.kv_cache already merged in); mode may be "auto"
    shape: GgufShape | None  # None: the GGUF header could not be read
    error: str | None = None  # why the header could not be read
    extra_bytes: int = 0  # memory the model brings besides its own estimate (a speculative draft model)


@dataclass(frozen=True)
class KvChoice:
    type_k: str
    type_v: str
    configured: str  # kv_cache.mode as configured ("auto" or a type)
    reason: str
    fits: bool  # whether all models of the budget fit its low watermark with this choice

    @property
    def label(self) -> str:
        return kv_label(self.type_k, self.type_v)


def kv_label(type_k: str, type_v: str) -> str:
    """`turbo3`, or `q8_0/turbo3` for K q8_0 with V turbo3."""
    return type_v if type_k == type_v else f"{type_k}/{type_v}"


def fmt_bytes(n: int) -> str:
    if n >= 2**30:
        return f"{n / 2**30:.1f} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def describe_budget(scope: str, capacity: int, low_percent: float) -> str:
    """E.g. `the device budget of 1.2 GiB after the 85% low watermark`."""
    return f"the {scope} budget of {fmt_bytes(int(capacity * low_percent / 100))} after the {low_percent:g}% low watermark"


def gqa_ratio(shape: GgufShape) -> float:
    return shape.n_head / max(shape.n_head_kv, 1)


def ladder(cfg: ModelConfig, shape: GgufShape | None, turbo_ok: bool) -> list[tuple[str, str]]:
    """The (K, V) rungs an auto model may take, least compressed first. Without flash attention
    (flash_attn: off) llama.cpp takes no quantized V: only K steps down, to q8_0."""
    if cfg.flash_attn == "off":
        return [(cfg.kv_cache.k, "f16")] if cfg.kv_cache.k else [("f16", "f16"), ("q8_0", "f16")]
    rungs = []
    for v in LADDER if turbo_ok else LADDER_NO_TURBO:
        if cfg.kv_cache.k:
            k = cfg.kv_cache.k
        elif v not in ("f16", "q8_0") and shape is not None and gqa_ratio(shape) >= GQA_KEEP_K:
            k = "q8_0"
        else:
            k = v
        rungs.append((k, v))
    return rungs


def choose_kv(
    models: list[KvInput],
    usable: int | None,
    budget: str,
    *,
    gpu: str | None = None,
    turbo_built: bool = True,
) -> dict[str, KvChoice]:
    """One choice per model sharing one budget (`usable` bytes, described by `budget`).

    `usable` None: not checked against the budget (no auto model; shapes may be None).

    `gpu`: the GPU backend models are offloaded to (None: CPU), which has no TurboQuant kernels
    and whose budget counts GPU memory only;
    `turbo_built`: whether llama.cpp has the TurboQuant types at all.
    """
    turbo_ok = gpu is None and turbo_built
    no_turbo = (f"turbo types skipped: this build offloads to {gpu}, which has no TurboQuant kernels" if gpu
                else "turbo types skipped: this llama.cpp build has no TurboQuant KV types")
    auto = [m for m in models if m.cfg.kv_cache.mode == "auto"]
    rungs = {m.cfg.name: ladder(m.cfg, m.shape, turbo_ok) for m in auto}
    at = {m.cfg.name: 0 for m in auto}

    def types(m: KvInput) -> tuple[str, str]:
        if m.cfg.name in at:
            return rungs[m.cfg.name][at[m.cfg.name]]
        return m.cfg.kv_cache.type_k, m.cfg.kv_cache.type_v

    def kv(m: KvInput) -> int:
        return estimate(m.shape, m.cfg, *types(m)).kv if m.shape else 0

    def charged(m: KvInput) -> int:
        est = dataclasses.replace(estimate(m.shape, m.cfg, *types(m)), draft_model=m.extra_bytes)
        if gpu is None:
            return est.total
        return offload.device_bytes(m.shape, est, -1 if m.cfg.n_gpu_layers == "auto" else m.cfg.n_gpu_layers)

    def total() -> int:
        return sum(charged(m) for m in models if m.shape)

    while usable is not None and total() > usable:
        steppable = [m for m in auto if m.shape and at[m.cfg.name] < len(rungs[m.cfg.name]) - 1]
        if not steppable:
            break
        at[max(steppable, key=kv).cfg.name] += 1  # max keeps the first of equals: config order
    if usable is not None and total() <= usable:
        # Stepping largest-first may have gone further than needed once others stepped too: raise
        # back, in config order, whatever still fits, so each model's rung above does not fit.
        for m in auto:
            while at[m.cfg.name] > 0:
                at[m.cfg.name] -= 1
                if total() > usable:
                    at[m.cfg.name] += 1
                    break

    need = total()
    fits = usable is None or need <= usable
    many = len(models) != 1
    n = f"{len(models)} model{'s' if many else ''}"
    they_need, fit, them = ("they need", "fit", "them") if many else ("it needs", "fits", "it")
    stepped = [m.cfg.name for m in auto if at[m.cfg.name] > 0]
    out: dict[str, KvChoice] = {}
    for m in models:
        k, v = types(m)
        label = kv_label(k, v)
        name = m.cfg.name
        notes: list[str] = []
        if name not in at:
            reason = f"{label}: configured"
            turbo = next((t for t in (v, k) if t in TURBO_TYPES), None)
            if turbo and gpu:
                notes.append(f"{turbo} KV cache has no {gpu} kernels in this build, so the load fails; "
                             "use q8_0/q4_0 or run on CPU")
            elif turbo and not turbo_built:
                notes.append("this llama.cpp build has no TurboQuant KV types, so the load fails")
            if not fits:
                notes.append(f"the {n} {'need' if many else 'needs'} {fmt_bytes(need)}, more than {budget}")
        elif m.shape is None:
            reason = f"{label}: the GGUF header could not be read ({m.error or 'unknown error'}); the load reports why"
        else:
            i = at[name]
            if not fits:
                reason = (f"{label}: nothing fits {budget} with {n}: {they_need} {fmt_bytes(need)} even with every "
                          "auto model at its last rung; loading is left to the budget checks")
            elif i == 0:
                others = [s for s in stepped if s != name]
                reason = f"{label}: the {n} {fit} {budget} ({fmt_bytes(need)} needed)"
                if others:
                    reason += f" once {', '.join(others)} stepped down"
            else:
                above = ", ".join(kv_label(*r) for r in rungs[name][:i])
                reason = f"{label}: {above} exceed {budget} with {n} ({label} brings {them} to {fmt_bytes(need)})"
            if v not in ("f16", "q8_0"):
                if m.cfg.kv_cache.k:
                    notes.append(f"K set to {m.cfg.kv_cache.k} by kv_cache.k")
                elif gqa_ratio(m.shape) >= GQA_KEEP_K:
                    notes.append(f"GQA {gqa_ratio(m.shape):g} ≥ {GQA_KEEP_K} so K stays q8_0")
                else:
                    notes.append(f"GQA {gqa_ratio(m.shape):g} < {GQA_KEEP_K} so K follows V")
            if not turbo_ok and i >= 2:
                notes.append(no_turbo)
        out[name] = KvChoice(k, v, m.cfg.kv_cache.mode, "; ".join([reason, *notes]), fits)
    return out
