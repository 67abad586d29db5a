"""The model manager: owns the runners and carries out the strategy's decisions under the memory budget."""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from msgspec import structs

from ..config import Config, ModelConfig, live_fields
from ..policy import Candidate, make_policy
from ..resources import file_facts, heap, memory, offload, repack
from ..resources.cores import CoreBudget
from ..resources.estimate import Estimate, GgufShape, draft_estimate, estimate, shape_from_header
from ..kv.adaptive import Change, Controller, ModelKv, Pressure
from ..resources.estimate import KV_BYTES_PER_VALUE
from ..resources.kv_choice import KvChoice, KvInput, choose_kv, describe_budget, kv_label, ladder
from ..kv import migrate
from ..kv.prefix_store import PrefixStore
from . import gguf_header, gguf_tensors, k_centering, native
from .client import render_chat
from .load_cancel import LoadCancelled
from .prefix import PrefixCache, context_layout, file_sha256, model_identity
from .speculative.draft_model import DraftModel
from .speculative.history import HistoryIndex
from .speculative.speculator import Speculator
from .runner import ModelRunner, NotReady
from .adapted_runner import AdaptedRunner
from .adapters import AdapterSet, lora_set

log = logging.getLogger("eie.manager")
MIB = 1024 * 1024
UNLOAD_SETTLE_S = 1.0  # how long an unload on request waits for requests that are ending before a 409
PREPARING_GRACE_S = 10.0  # how long a request that took a runner may take to submit before the keep-alive ignores it
JANITOR_BUSY_S = 0.25  # the janitor's pace while a model works, loads or changes KV types (memory moves)
JANITOR_IDLE_S = 2.0  # its longest sleep while every model is idle: an idle appliance is not woken 4 times a second
# Prefix-cache disk writes wait for this long without any decoding (between two steps of a
# running request the cores are free for a moment only), but at most WRITE_MAX_DEFER_S after
# they were queued.
WRITE_QUIET_S = 0.5
WRITE_MAX_DEFER_S = 5.0


class PolicyRefused(Exception):
    """The strategy does not allow this load or unload (HTTP 409)."""


class ModelBusy(Exception):
    """The model has requests in flight and cannot be unloaded now (HTTP 409)."""


class InsufficientMemory(Exception):
    """Loading would cross the critical watermark and nothing can be evicted (HTTP 507)."""


@dataclass(frozen=True)
class Budget:
    capacity: int
    low: int
    critical: int
    scope: str  # "device" or "group:<name>"


_shapes: dict[tuple[str, int, int], GgufShape] = {}
# Why a file version could not be read: kept for the process only, so the child read (0.3-1.3 s)
# runs once per version; a rewritten file has a new key, and a new build a new process.
_shape_failures: dict[tuple[str, int, int], str] = {}


def shape_of(path: Path, cache_dir: Path | None = None) -> GgufShape:
    """A GGUF file's dimensions, cached per version of the file (in memory, and on disk under
    `cache_dir`: reading a header costs a vocab-only load in a child); raises ValueError, also
    cached per version."""
    try:
        key = file_facts.stat_key(path)
    except FileNotFoundError:
        raise ValueError(f"model file not found: {path}") from None
    if key in _shape_failures:
        raise ValueError(_shape_failures[key])
    if key not in _shapes:
        try:
            _shapes[key] = _read_shape(path, key, cache_dir)
        except ValueError as e:
            _shape_failures[key] = str(e)
            raise
    return _shapes[key]


def _read_shape(path: Path, key: tuple, cache_dir: Path | None) -> GgufShape:
    stored = file_facts.load(cache_dir, file_facts.GGUF_SHAPE, key)
    try:
        return GgufShape(**{**stored, "block_bytes": tuple(stored["block_bytes"])})
    except (TypeError, KeyError):  # missing, unreadable or from another version of this code
        pass
    shape = shape_from_header(gguf_header.read(path), path.stat().st_size)
    tensors = gguf_tensors.table(path)
    tied_type, tied_bytes = repack.tied_output(tensors)
    blocks, output = offload.layer_table(gguf_tensors.sizes(tensors), shape.n_layer, tied_bytes)
    shape = dataclasses.replace(shape, tied_output_type=tied_type, tied_output_bytes=tied_bytes,
                                block_bytes=blocks, output_bytes=output)
    file_facts.save(cache_dir, file_facts.GGUF_SHAPE, key, dataclasses.asdict(shape))
    return shape


class ModelManager:
    def __init__(self, config: Config, cores: CoreBudget | None = None):
        self.config = config
        self.cores = cores or CoreBudget()
        self.policy = make_policy(config)
        self.estimates: dict[str, Estimate | None] = {}
        self._estimated: dict[str, ModelConfig] = {}  # the config each estimate was made for
        self.last_used: dict[str, float] = {}
        # When a request last took the model's runner (ready_runner): until its sequences are
        # submitted the runner looks idle, and the keep-alive must not unload it under the request.
        self.asked_at: dict[str, float] = {}
        # HTTP requests that took the model's runner and have not ended (hold): the model is in
        # use for them from before their sequences are submitted, so no unload or eviction takes
        # it from under them.
        self._holds: collections.Counter[str] = collections.Counter()
        self._holds_lock = threading.Lock()  # (not _lock: the event loop takes it, and _lock is held through unloads)
        # The adapter sets names were given by POST /lora-adapters (llama-server's global scales),
        # in place of the set the config gives them (none for a model's own name); kept until a
        # reload changes the model's adapters.
        self.lora_sets: dict[str, AdapterSet] = {}
        # A client's keep-alive for a model (Ollama's keep_alive), over the strategy's: seconds
        # idle before unloading (inf: never for idleness); where the strategy may unload it.
        self.keep_alive_asked: dict[str, float] = {}
        self.events: collections.deque[dict] = collections.deque(maxlen=100)
        self.counters = collections.Counter()
        # (model, event kind) -> count, for the metrics: load, load_failed, eviction, unload, kv_change, ...
        self.model_counters: collections.Counter[tuple[str, str]] = collections.Counter()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._janitor_wake = threading.Event()  # a request took a model, or the stop: a pass now
        self._threads: list[threading.Thread] = []
        self._loading: dict[str, threading.Event] = {}  # loads in flight, set when done
        # Loads on demand run here, one shared future per model, so requests waiting for a load
        # hold no thread of the event loop's default executor (see load_async).
        self._demand_pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="model-load-demand")
        self._demand: dict[str, concurrent.futures.Future[ModelRunner]] = {}
        self._demand_lock = threading.Lock()  # held for a dict lookup only: load_async takes it on the event loop
        self._group_of = {}
        for g in config.groups:
            for m in g.models:
                self._group_of.setdefault(config.base_of(m), g)
        # The GPU backend llama.cpp offloads to (None: the CPU). A GPU's budget counts what models
        # put in its memory; the RAM's counts everything (resources/offload.py).
        self.gpu = native.gpu_backend()
        self._charged: dict[str, int] = {}  # bytes a load in flight is charged (its estimate on the budget's device)
        self.kv_choices: dict[str, KvChoice] = self._choose_kv()
        self.runners: dict[str, ModelRunner] = {m.name: self._new_runner(m) for m in config.models}
        self.kv_controller = self._kv_controller(config)
        self._kv_changing: set[str] = set()  # models with a KV migration in flight
        self._rungs: dict[tuple, list[tuple[str, str]]] = {}

    @staticmethod
    def _kv_controller(config: Config) -> Controller:
        a = config.inference.kv_adaptive
        return Controller(cooldown_s=a.cooldown_s, upgrade_after_s=a.upgrade_after_s, margin=a.margin_percent / 100)

    def _new_runner(self, cfg: ModelConfig) -> ModelRunner:
        return ModelRunner(self._with_kv_choice(cfg), self.config.model_path(cfg), self.cores,
                           prefix_factory=self._prefix_cache, speculator_factory=self._speculator,
                           cache_dir=self.config.cache_dir(), cancel=self._stop,
                           adapter_files=[(a.name, self.config.adapter_path(a)) for a in cfg.lora],
                           control_files=self.config.control_files(cfg),
                           preempt_background=self.config.server.batches.preempt, park_room=self._park_room)

    def _park_room(self) -> int:
        """Host memory a parked background sequence's state may take: what is available beyond
        vram.reserve_mb (parked states are host memory whatever device holds the KV)."""
        return memory.ram().free_bytes - self.config.vram.reserve_mb * MIB

    def _adapter_estimate(self, cfg: ModelConfig) -> int:
        """What the model's LoRA adapters and control vectors will take: their files' size (an
        unreadable one: 0, its load says why)."""
        total = 0
        for a in (*cfg.lora, *cfg.control_vectors):
            try:
                total += self.config.adapter_path(a).stat().st_size
            except OSError:
                pass
        return total

    def _speculator(self, runner: ModelRunner) -> Speculator | None:
        """The speculative decoding of a runner whose model just loaded (None when it has no
        sources); raises VocabMismatch when the draft model's vocabulary differs."""
        spec = runner.cfg.speculative
        if not spec.sources:
            return None
        index = next(i for i, m in enumerate(self.config.models) if m.name == runner.name)
        history = draft = None
        if "history" in spec.sources:
            disk = self.config.kv_disk_dir(runner.cfg)
            path = disk / "speculative" / f"{file_sha256(runner.path, self.config.cache_dir())[:32]}.history" if disk else None
            history = HistoryIndex(path, max_tokens=spec.history_tokens)
        draft_path = self._draft_path(runner.cfg)
        if draft_path is not None:
            draft = DraftModel(draft_path, runner.vocab,
                               what=f"models[{index}].speculative.draft_model ({spec.draft_model!r} for "
                                    f"model {runner.name!r})",
                               n_seq_max=runner.cfg.n_parallel, n_ctx_total=runner.cfg.n_ctx * runner.cfg.n_parallel,
                               n_batch=runner.batch_cap, threads=runner.threads, cores=self.cores,
                               cancel=runner.cancel, n_gpu_layers=0 if runner.gpu_layers == 0 else -1)
        return Speculator(spec, history, draft)

    def _prefix_cache(self, runner: ModelRunner) -> PrefixCache | None:
        """The prefix cache of a runner whose context was just created (None when off)."""
        settings = runner.cfg.kv_cache.prefix
        if not settings.enabled:
            return None
        loaded = runner.loaded
        if loaded.args.flash_attn == "off":  # (each save failed with a warning, and nothing was ever cached)
            raise RuntimeError("it needs flash attention: a state with V transposed (flash_attn: off) is not "
                               "read or written here")
        disk = runner.cfg.kv_cache.disk
        rot = migrate.rotation_sizes(loaded.metadata)
        encode, codec = None, "raw"
        if disk.compress:
            mode = disk.compress
            encode, codec = (lambda state: migrate.compress(state, mode, rot)), mode
        store = PrefixStore(
            model_identity(runner.path, loaded.type_k, loaded.type_v, k_centering.digest(loaded.k_centers),
                           self.config.cache_dir(), window=bool(loaded.swa_window),
                           layout=context_layout(loaded.n_ctx_total // max(loaded.args.n_seq_max, 1),
                                                 loaded.args.flash_attn)),
            block=settings.block_tokens,
            ram_bytes=settings.ram_mb * MIB,
            disk_dir=self.config.kv_disk_dir(runner.cfg),
            disk_bytes=disk.max_mb * MIB,
            encode=encode,
            codec=codec,
            wait_quiet=lambda max_s: self.cores.wait_quiet(WRITE_QUIET_S, max_s),
            max_defer_s=WRITE_MAX_DEFER_S,
            prune_after_s=disk.prune_after_days * 86400,
        )
        return PrefixCache(store, rot, loaded.args.n_seq_max, loaded.swa_window, (loaded.type_k, loaded.type_v),
                           n_swa=loaded.n_swa)

    def _with_kv_choice(self, cfg: ModelConfig) -> ModelConfig:
        """The model's config with `kv_cache.mode: auto` replaced by the current choice."""
        configured = self.config.model(cfg.name) or cfg
        choice = self.kv_choices.get(cfg.name)
        if configured.kv_cache.mode != "auto" or choice is None:
            return cfg
        kv = structs.replace(configured.kv_cache, mode=choice.type_v,
                             k=choice.type_k if choice.type_k != choice.type_v else None)
        return structs.replace(configured, kv_cache=kv)

    # ---- KV cache types ----------------------------------------------------------------------

    def _choose_kv(self) -> dict[str, KvChoice]:
        """Resolve `kv_cache.mode: auto` for every model, per budget (see resources/kv_choice.py).

        GGUF headers are read only when some model of the budget is auto; otherwise the
        configured types stand and are not checked against the budget here (loads still are).
        """
        gpu, turbo_built = native.gpu_backend(), native.build_has_turboquant()
        scopes: dict[str, tuple[Budget, list[ModelConfig]]] = {}
        for m in self.config.models:
            b = self.budget(m.name)
            scopes.setdefault(b.scope, (b, []))[1].append(m)
        out: dict[str, KvChoice] = {}
        for budget, models in scopes.values():
            any_auto = any(m.kv_cache.mode == "auto" for m in models)
            if any_auto:  # each header not cached yet is read in a child process: several at once
                with concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="gguf-header") as pool:
                    inputs = list(pool.map(self._kv_input, models))
            else:
                inputs = [KvInput(m, None) for m in models]
            desc = describe_budget(budget.scope, budget.capacity, self.config.vram.low_watermark)
            out.update(choose_kv(inputs, budget.low if any_auto else None, desc, gpu=gpu, turbo_built=turbo_built))
        for m in self.config.models:
            c = out[m.name]
            if m.kv_cache.mode == "auto":
                log.info("model %s KV cache (auto) %s", m.name, c.reason)
                self._event("kv_choice", m.name, c.reason)
            elif c.reason != f"{c.label}: configured":
                log.warning("model %s KV cache %s", m.name, c.reason)
        return out

    def _kv_input(self, cfg: ModelConfig) -> KvInput:
        try:
            shape = shape_of(self.config.model_path(cfg), self.config.cache_dir())
        except (OSError, ValueError) as e:
            return KvInput(cfg, None, str(e))
        try:
            extra = self._draft_estimate(cfg)
        except (OSError, ValueError):
            extra = 0  # unreadable: the draft model's load reports why
        return KvInput(cfg, shape, extra_bytes=extra + self._adapter_estimate(cfg))

    def kv_status(self, name: str) -> dict:
        """How the model's KV cache types came about, for /v1/admin/vram/status."""
        configured = self.config.model(name)
        runner = self.runners[name]
        choice = self.kv_choices.get(name)
        reason = choice.reason if choice else None
        kv = runner.cfg.kv_cache
        loaded_with = (kv.type_k, kv.type_v)
        if choice and runner.state == "ready" and loaded_with != (choice.type_k, choice.type_v):
            reason += f" (applies at the next load; loaded with {kv_label(*loaded_with)})"
        return {"kv_mode_configured": configured.kv_cache.mode if configured else kv.mode,
                "kv_k_configured": configured.kv_cache.k if configured else kv.k,
                "kv_adaptive": kv.adaptive,
                "kv_choice_reason": reason,
                "kv_loaded_with": kv_label(*loaded_with),
                "kv_changes": list(runner.kv_changes),
                "k_centered": bool(runner.loaded is not None and runner.loaded.k_centers is not None),
                "decode_ms": runner.decode_ms()}

    # ---- adaptive KV -------------------------------------------------------------------------

    def kv_rungs(self, runner: ModelRunner) -> list[tuple[str, str]]:
        """The model's KV types from the one it was loaded with down to the most compressed."""
        kv = runner.cfg.kv_cache
        key = (runner.path, kv.type_k, kv.type_v, kv.k, runner.cfg.flash_attn)
        if key not in self._rungs:
            self._rungs[key] = self._kv_rungs(runner)
        return self._rungs[key]

    def _kv_rungs(self, runner: ModelRunner) -> list[tuple[str, str]]:
        start = (runner.cfg.kv_cache.type_k, runner.cfg.kv_cache.type_v)
        try:
            shape = shape_of(runner.path, self.config.cache_dir())
        except (OSError, ValueError):
            shape = None
        turbo_ok = native.gpu_backend() is None and native.build_has_turboquant()
        full = ladder(runner.cfg, shape, turbo_ok)
        if start in full:
            return full[full.index(start):]
        size = lambda r: KV_BYTES_PER_VALUE[r[0]] + KV_BYTES_PER_VALUE[r[1]]  # noqa: E731
        return [start, *[r for r in full if size(r) < size(start)]]

    def change_kv(self, name: str, type_k: str, type_v: str, reason: str, direction: str = "forced"):
        """Migrate a loaded model's KV to other types (a concurrent.futures.Future of the record)."""
        runner = self.runners[name]
        with self._lock:
            self._kv_changing.add(name)
        fut = runner.change_kv_types(type_k, type_v, reason)

        def done(f) -> None:
            with self._lock:
                self._kv_changing.discard(name)
            if f.exception() is None and f.result().get("changed"):
                rec = f.result()
                self.counters[f"kv_{direction}grades" if direction in ("up", "down") else "kv_forced_changes"] += 1
                self._event("kv_change", name, f"{kv_label(*rec['from'])} -> {kv_label(*rec['to'])}: {reason}")
            elif f.exception() is not None:
                self.counters["kv_change_failures"] += 1
                self._event("kv_change_failed", name, str(f.exception()))

        fut.add_done_callback(done)
        return fut

    def _spill_prefixes(self) -> None:
        """Above the low watermark, saved prefixes (idle conversations among them) leave RAM for
        the disk tier, where the next request of the conversation finds them. (A GPU's budget does not
        count them: they are in RAM.)"""
        if self.gpu:
            return
        for budget in {b.scope: b for b in map(self.budget, list(self.runners))}.values():
            self._spill(budget, lambda: self.used(budget) <= budget.low)

    def _spill(self, budget: Budget, enough: Callable[[], bool], exclude: str = "") -> None:
        """The saved prefixes of the budget's models (`exclude` aside) leave RAM for the disk tier,
        a model's at a time, until `enough()`."""
        for name in self._scope_models(budget):
            if enough():
                return
            r = self.runners[name]
            if name != exclude and r.state == "ready" and r.prefix is not None and r.prefix.store.ram_used:
                freed = r.prefix.store.shrink_ram(0)
                heap.trim()
                self._event("prefix_spill", name, f"{freed} bytes of saved prefixes moved out of RAM")
                self.counters["prefix_spills"] += 1

    def _adapt_kv(self) -> set[str]:
        """One adaptive-KV decision per budget; returns the scopes where a change is under way."""
        started: set[str] = set()
        if not any(r.cfg.kv_cache.adaptive for r in self.runners.values()):
            return started
        now = time.monotonic()
        for budget in {b.scope: b for b in map(self.budget, list(self.runners))}.values():
            models = []
            for name in self._scope_models(budget):
                r = self.runners[name]
                if name in self._kv_changing:
                    started.add(budget.scope)  # wait for it before anything else here
                    continue
                if r.state != "ready" or not r.cfg.kv_cache.adaptive:
                    continue
                rungs = self.kv_rungs(r)
                try:
                    shape = shape_of(r.path, self.config.cache_dir())
                    sizes = [estimate(shape, r.cfg, k, v).kv for k, v in rungs]
                except (OSError, ValueError):
                    continue
                models.append(ModelKv(name, rungs, r.kv_types, sizes, r.decode_ms(), r.cfg.kv_cache.max_decode_ms))
            if not models:
                continue
            pressure = Pressure(self.used(budget), budget.capacity, budget.low, budget.scope)
            change: Change | None = self.kv_controller.decide(models, pressure, now)
            if change:
                log.info("model %s adaptive KV %s to %s: %s", change.model, change.direction,
                         kv_label(*change.to), change.reason)
                self.change_kv(change.model, *change.to, change.reason, change.direction)
                started.add(budget.scope)
        return started

    # ---- lifecycle -------------------------------------------------------------------------

    def boot_models(self) -> list[str]:
        return self.policy.boot_models()

    def start(self) -> None:
        """Load the boot set in the background; /health reports progress."""
        for name in self.boot_models():
            self.runners[name].state = "loading"
        boot = threading.Thread(target=self._boot, name="model-boot", daemon=True)
        self._threads.append(boot)
        boot.start()
        janitor = threading.Thread(target=self._janitor, name="model-janitor", daemon=True)
        self._threads.append(janitor)
        janitor.start()

    def _boot(self) -> None:
        """Load the boot set two at a time: a load is partly I/O and page faults, partly single-
        threaded work (llama.cpp's tensor setup and repacking), so two overlap well; llama.cpp's
        own threads during a load (K centring's calibration) take cores from the budget."""
        names = self.boot_models()
        with concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="model-load") as pool:
            list(pool.map(self._load_quietly, names))

    def wait_booted(self, timeout: float | None = None) -> bool:
        if not self._threads:
            return True
        self._threads[0].join(timeout)
        return not self._threads[0].is_alive()

    def stop(self) -> None:
        """Stop everything. Loads still under way give up at their next check (runners share
        `_stop` as their cancel flag: engine/load_cancel.py), so a stop during the boot is quick."""
        self._stop.set()
        self._janitor_wake.set()
        self._demand_pool.shutdown(wait=True, cancel_futures=True)
        self.wait_booted(timeout=120)
        for r in self.runners.values():
            r.stop()
        self.policy.close()

    # ---- memory ----------------------------------------------------------------------------

    def estimate_for(self, name: str) -> Estimate | None:
        runner = self.runners[name]
        if self._estimated.get(name) != runner.cfg:  # a new runner may have other KV types (auto)
            try:
                est = estimate(shape_of(runner.path, self.config.cache_dir()), runner.cfg)
                self.estimates[name] = dataclasses.replace(est, draft_model=self._draft_estimate(runner.cfg),
                                                           lora_adapters=self._adapter_estimate(runner.cfg))
            except (OSError, ValueError):
                self.estimates[name] = None  # unreadable: the load itself reports why
            self._estimated[name] = runner.cfg
        return self.estimates[name]

    def _draft_path(self, cfg: ModelConfig) -> Path | None:
        """The GGUF of the model's speculative draft model, when it has one (a model inheriting
        itself as draft model has none)."""
        spec = cfg.speculative
        if "draft_model" not in spec.sources or spec.draft_model in (None, cfg.name):
            return None
        return self.config.draft_path(cfg)

    def _draft_estimate(self, cfg: ModelConfig) -> int:
        """What the model's draft model will take (0 without one); OSError/ValueError when its
        GGUF cannot be read."""
        draft = self._draft_path(cfg)
        return draft_estimate(shape_of(draft, self.config.cache_dir()), cfg) if draft is not None else 0

    def gpu_layers(self, name: str) -> dict | None:
        """The model's layers on the GPU, {"offloaded", "of"} (for `auto`, all of them until a
        load places fewer), None without a GPU."""
        if self.gpu is None:
            return None
        runner = self.runners[name]
        try:
            total = offload.all_layers(shape_of(runner.path, self.config.cache_dir()))
        except (OSError, ValueError):
            return {"offloaded": None, "of": None}
        return {"offloaded": total if runner.gpu_layers < 0 else min(runner.gpu_layers, total), "of": total}

    def estimated_gpu_bytes(self, name: str) -> int | None:
        """What the estimate puts on the GPU for the model's layers there (resources/offload.py),
        beside the measured `gpu_memory_bytes`; None without a GPU or an estimate."""
        est = self.estimate_for(name) if self.gpu is not None else None
        if est is None:
            return None
        try:
            shape = shape_of(self.runners[name].path, self.config.cache_dir())
        except (OSError, ValueError):
            return None
        return offload.device_bytes(shape, est, self.runners[name].gpu_layers)

    def _charge(self, buffers: native.BufferSizes) -> int:
        """What the budget's device holds of these buffers: a GPU its own memory's part, the RAM all."""
        return buffers.device if self.gpu else buffers.total

    def draft_measured(self, runner: ModelRunner) -> int:
        """Bytes of the runner's draft model (weights, KV, compute) on the budget's device, 0 without one."""
        spec = runner.spec
        return self._charge(spec.draft.loaded.buffers) if spec is not None and spec.draft is not None else 0

    def measured(self, runner: ModelRunner) -> int:
        """Bytes of a loaded model (and its draft model and LoRA adapters) on the budget's device;
        adapters are charged whole (on a GPU llama.cpp puts an adapter's tensors beside the layer's)."""
        if runner.loaded is None:
            return 0
        return self._charge(runner.loaded.buffers) + self.draft_measured(runner) + runner.adapter_bytes

    def _held(self, name: str) -> int:
        """Memory a model holds now: measured when loaded, estimated while loading. Saved prefixes
        in RAM count against the RAM's budget, not a GPU's."""
        r = self.runners[name]
        if r.state == "ready":
            ram = r.prefix.store.ram_used if r.prefix is not None and not self.gpu else 0
            return self.measured(r) + ram
        if r.state == "loading":
            if name in self._charged:
                return self._charged[name]
            est = self.estimates.get(name)
            return est.total if est else 0
        return 0

    @property
    def _isolated(self) -> bool:
        """Whether groups with a budget_mb get pools of their own."""
        return self.config.vram.group_isolation or getattr(self.policy, "isolates_groups", False)

    def budget(self, for_model: str | None = None) -> Budget:
        vram = self.config.vram
        group = self._group_of.get(for_model) if for_model else None
        if self._isolated and group is not None and group.budget_mb:
            capacity, scope = group.budget_mb * MIB, f"group:{group.name}"
        elif vram.budget_mb:
            capacity, scope = vram.budget_mb * MIB, "device"
        else:
            total = memory.compute_device().total_bytes
            capacity, scope = max(0, total - vram.reserve_mb * MIB), "device"
        if scope == "device" and self._isolated:  # the group pools come out of the device's budget
            capacity = max(0, capacity - sum(g.budget_mb * MIB for g in self.config.groups if g.budget_mb))
        return Budget(capacity, int(capacity * vram.low_watermark / 100), int(capacity * vram.critical_watermark / 100),
                      scope)

    def _scope_models(self, budget: Budget) -> list[str]:
        if budget.scope.startswith("group:"):
            group = budget.scope[len("group:") :]
            return [n for n in self.runners if self._group_of.get(n) and self._group_of[n].name == group]
        if self._isolated:  # the device pool holds the models that have no group budget of their own
            return [n for n in self.runners if not (self._group_of.get(n) and self._group_of[n].budget_mb)]
        return list(self.runners)

    def used(self, budget: Budget, exclude: str | None = None) -> int:
        return sum(self._held(n) for n in self._scope_models(budget) if n != exclude)

    def _candidates(self, budget: Budget, exclude: str) -> list[Candidate]:
        out = []
        for name in self._scope_models(budget):
            r = self.runners[name]
            if name == exclude or r.state != "ready" or self._in_use(name):
                continue
            group = self._group_of.get(name)
            last = max(self.last_used.get(name, 0.0), r.last_finished)
            out.append(Candidate(name, self.measured(r), last, group.name if group else None))
        return out

    def _evict_for(self, name: str, need: int) -> bool:
        """Evict what the strategy lets go until `need` more bytes fit under the critical watermark;
        False when they still do not."""
        budget = self.budget(name)
        fits = lambda: self.used(budget, exclude=name) + need <= budget.critical  # noqa: E731
        if not self.gpu:  # saved prefixes are a cache: they leave RAM before any model goes
            self._spill(budget, fits, exclude=name)
        while not fits():
            victim = self._choose_victim(budget, name)
            if victim is None:
                return False
            self._unload(victim, f"evicted by {self.policy.name} to make room for {name}")
        return True

    def _choose_victim(self, budget: Budget, for_model: str) -> str | None:
        """The idle model the strategy evicts next for `for_model` ("" for the low watermark), or
        None: an answer that is not one of the candidates offered (a plugin's: a model not loaded,
        or one in use) evicts nothing."""
        candidates = self._candidates(budget, for_model)
        victim = self.policy.choose_eviction(candidates, for_model)
        if victim is not None and victim not in {c.name for c in candidates}:
            log.warning("strategy %s chose %r to evict, which is not an idle candidate (%s): nothing evicted",
                        self.policy.name, victim, ", ".join(c.name for c in candidates) or "none")
            return None
        return victim

    def _make_room(self, name: str, need: int) -> None:
        if not self._evict_for(name, need):
            budget = self.budget(name)
            self.counters["loads_refused"] += 1
            raise InsufficientMemory(
                f"loading {name!r} needs about {need / MIB:.0f} MiB; {self.used(budget, name) / MIB:.0f} MiB of the "
                f"{budget.capacity / MIB:.0f} MiB {budget.scope} budget are in use, the critical watermark is "
                f"{self.config.vram.critical_watermark:g}% and no idle, unpinned model can be evicted"
            )

    def _place(self, name: str, cfg: ModelConfig, est: Estimate) -> tuple[int | None, int]:
        """Make room for a model's load and, on a GPU, decide how many layers it offloads
        (`n_gpu_layers: auto`: all when they fit, after any evictions the strategy allows, else
        the most that fit). Returns (the layers, None where the config's number stands; the bytes
        the budget is charged while it loads). Raises InsufficientMemory."""
        shape = None
        if self.gpu is not None:
            try:
                shape = shape_of(self.config.model_path(cfg), self.config.cache_dir())
            except (OSError, ValueError):
                pass  # unreadable: charged its whole estimate, and the load reports why
        if shape is None:
            self._make_room(name, est.total)
            return None, est.total
        if cfg.n_gpu_layers != "auto":
            need = offload.device_bytes(shape, est, cfg.n_gpu_layers)
            self._make_room(name, need)
            return None, need
        need = offload.device_bytes(shape, est, -1)
        if self._evict_for(name, need):
            return -1, need
        budget = self.budget(name)
        room = budget.critical - self.used(budget, exclude=name)
        layers = offload.fit_layers(shape, est, room)
        if layers is None:
            self._make_room(name, need)  # raises, with what the whole model needs
        part = offload.device_bytes(shape, est, layers)
        why = (f"{layers} of {offload.all_layers(shape)} layers on {self.gpu}: all of them need about "
               f"{need / MIB:.0f} MiB, {max(room, 0) / MIB:.0f} MiB of the {budget.scope} budget are free under "
               f"the critical watermark")
        log.warning("model %s: %s", name, why)
        self._event("partial_offload", name, why)
        return layers, part

    # ---- load and unload -------------------------------------------------------------------

    def load(self, name: str, boot: bool = False) -> ModelRunner:
        """Load a configured model (blocking). Raises PolicyRefused or InsufficientMemory."""
        if not boot:
            reason = self.policy.refuse_load(name)
            if reason:
                raise PolicyRefused(reason)
        self._read_headers(self.runners[name])
        with self._lock:
            runner = self.runners[name]
            if runner.state == "ready":
                return runner
            in_flight = self._loading.get(name)
            if in_flight is None:
                est = self.estimate_for(name)
                layers = None
                if est is not None:  # counts other loads in flight by what they are charged
                    layers, self._charged[name] = self._place(name, runner.cfg, est)
                if runner.state not in ("unloaded", "loading"):
                    runner = self.runners[name] = self._new_runner(runner.cfg)
                if layers is not None:
                    runner.gpu_layers = layers
                runner.state = "loading"
                self._loading[name] = threading.Event()
        if in_flight is not None:  # someone else is loading it: wait for that load
            in_flight.wait()
            return self.runners[name]
        try:
            try:  # a file llama.cpp would abort the process on fails here, in a child (engine/gguf_header.py)
                shape_of(runner.path, self.config.cache_dir())
            except (OSError, ValueError) as e:
                runner.fail_load(e)
            else:
                runner.load()  # outside the lock: other models can load meanwhile
        finally:
            with self._lock:
                self.last_used[name] = time.monotonic()
                if runner.state == "ready":
                    self.counters["loads"] += 1
                    self._event("load", name, f"loaded in {runner.load_seconds:.2f}s")
                    self._warm_prefixes(runner)
                elif isinstance(runner.load_exception, LoadCancelled):
                    self._event("load_cancelled", name, runner.error or "")
                else:
                    self.counters["load_failures"] += 1
                    self._event("load_failed", name, runner.error or "")
                self._loading.pop(name).set()
                self._charged.pop(name, None)
        return runner

    def _read_headers(self, runner: ModelRunner) -> None:
        """Read the model's GGUF header and its draft model's (each in a child, engine/gguf_header.py)
        before `load` takes the lock, which other loads and the janitor need meanwhile; the
        estimate under the lock then finds them cached, failures included (the load reports those)."""
        for path in (runner.path, self._draft_path(runner.cfg)):
            if path is None:
                continue
            try:
                shape_of(path, self.config.cache_dir())
            except (OSError, ValueError):
                pass

    async def load_async(self, name: str, timeout: float | None = None) -> ModelRunner:
        """`load` without holding a thread while waiting: every caller for a model awaits one
        shared load. Waiting in `load` itself would take a thread of the default executor per
        caller, and a dozen requests for a loading model would then stall everything else that
        runs there (chat templates of other models' requests, memory probes) for the whole load.
        A caller's timeout or cancellation leaves the load running for the others. (Not under
        `_lock`: a load or an eviction can hold that for seconds, and this runs on the event loop.)"""
        with self._demand_lock:
            fut = self._demand.get(name)
            if fut is None or fut.done():
                fut = self._demand[name] = self._demand_pool.submit(self.load, name)
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(fut)), timeout)

    def _warm_prefixes(self, runner: ModelRunner) -> None:
        """Prefill and save the configured system prompts (kv_cache.prefix.warm), in the background."""
        if runner.prefix is None:
            return
        for i, text in enumerate(runner.cfg.kv_cache.prefix.warm):
            try:
                tokens = render_chat(runner, [{"role": "system", "content": text}, {"role": "user", "content": "…"}])
                fut = runner.warm(tokens)
            except Exception as e:
                log.warning("model %s: kv_cache.prefix.warm[%d] was not prefilled: %s", runner.name, i, e)
                continue

            def done(f, name=runner.name, i=i) -> None:
                if f.exception() is None:
                    log.info("model %s: warmed a prefix of %d tokens", name, f.result()["cached_tokens"])
                else:
                    log.warning("model %s: kv_cache.prefix.warm[%d] failed: %s", name, i, f.exception())

            fut.add_done_callback(done)

    def unload(self, name: str) -> None:
        """Unload on request (admin). Raises PolicyRefused or ModelBusy."""
        reason = self.policy.refuse_unload(name)
        if reason:
            raise PolicyRefused(reason)
        # a model loading is unloaded once its load ends (it was left loaded, the unload a 200)
        loading = self._loading.get(name)
        if loading is not None and not loading.wait(self.config.policy.load_timeout_s):
            raise ModelBusy(f"model {name!r} is still loading")
        # a request whose answer just went out may still be ending (its context saved for the next
        # turn, its hold released once its response is sent): give it a moment, not a 409
        settle = time.monotonic() + UNLOAD_SETTLE_S
        while self._in_use(name) and time.monotonic() < settle:
            time.sleep(0.02)
        with self._lock:
            runner = self.runners[name]
            if runner.state != "ready":
                return
            if self._in_use(name):
                raise ModelBusy(f"model {name!r} has requests in flight")
            self._unload(name, "unloaded on request")

    def ask_keep_alive(self, name: str, seconds: float | None) -> None:
        """A client's keep-alive for `name` (None: the strategy's again). It holds only where the
        strategy loads on demand and may unload the model; elsewhere the strategy decides."""
        if seconds is None:
            self.keep_alive_asked.pop(name, None)
        else:
            self.keep_alive_asked[name] = seconds

    def idle_limit_s(self, name: str) -> float | None:
        """Idle seconds before `name` is unloaded (None: never for idleness)."""
        if not self.policy.loads_on_demand:
            return None
        asked = self.keep_alive_asked.get(name)
        if asked is not None and self.policy.refuse_unload(name) is None:
            return None if asked == float("inf") else asked
        return self.policy.keep_alive_s(name)

    def idle_unload_at(self, name: str) -> float | None:
        """When (time.time()) an idle `name` is unloaded at the latest, if it stays idle (None: never)."""
        limit = self.idle_limit_s(name)
        if limit is None:
            return None
        runner = self.runners[name]
        now = time.monotonic()
        idle_since = now if runner.running() or runner.queue_depth() else self._idle_since(name, now)
        return time.time() + max(0.0, idle_since + limit - now)

    def _preparing(self, name: str, now: float) -> bool:
        """Whether a request took the model's runner after its last sequence ended and may still
        be making its prompt (for at most PREPARING_GRACE_S: one that failed before submitting
        holds the model no longer)."""
        asked = self.asked_at.get(name, 0.0)
        return asked > self.runners[name].last_finished and now - asked < PREPARING_GRACE_S

    def hold(self, name: str) -> Callable[[], None]:
        """Mark `name` in use by a request until the returned release is called (once is enough;
        later calls do nothing)."""
        with self._holds_lock:
            self._holds[name] += 1
        released = False

        def release() -> None:
            nonlocal released
            with self._holds_lock:
                if not released:
                    released = True
                    self._holds[name] -= 1
                    if self._holds[name] <= 0:
                        del self._holds[name]
        return release

    def hold_runner(self, runner: ModelRunner) -> Callable[[], None]:
        """hold() the model a runner ready_runner gave serves (an adapter's: its base model)."""
        return self.hold(runner.base.name if isinstance(runner, AdaptedRunner) else runner.name)

    def _in_use(self, name: str) -> bool:
        """Whether requests use the model: running, queued, or held by a request that took it and
        may still be making its prompt (unloading it then fails that request)."""
        r = self.runners[name]
        return bool(r.answering() or r.queue_depth() or self._holds.get(name))

    def _idle_since(self, name: str, now: float) -> float:
        """When `name` was last asked for or last finished a sequence (monotonic)."""
        return max(self.last_used.get(name, now), self.runners[name].last_finished)

    def _unload(self, name: str, why: str) -> None:
        runner = self.runners[name]
        runner.stop()
        self.runners[name] = self._new_runner(runner.cfg)
        self.counters["evictions" if why.startswith("evicted") else "unloads"] += 1
        self.model_counters[(name, "eviction" if why.startswith("evicted") else "unload")] += 1
        self._event("unload", name, why)
        log.info("model %s %s", name, why)

    def _event(self, kind: str, model: str, detail: str) -> None:
        if kind != "unload":  # unloads are counted as evictions or unloads by _unload
            self.model_counters[(model, kind)] += 1
        self.events.append({"time": time.time(), "event": kind, "model": model, "detail": detail})

    def adapter_target(self, name: str) -> tuple[str, AdapterSet] | None:
        """For a LoRA adapter's name (models[].lora), or a name POST /lora-adapters gave a set: its
        model's name and the adapter set it serves (None: the model's own name, no adapters)."""
        if name in self.lora_sets:
            return self.config.base_of(name), self.lora_sets[name]
        found = self.config.adapter(name)
        if found is None:
            return None
        cfg, index = found
        return cfg.name, lora_set(index, cfg.lora[index].scale)

    def set_lora(self, name: str, chosen: AdapterSet) -> None:
        """Serve `chosen` under `name` (a model's or an adapter's name) from now on."""
        with self._lock:
            if not chosen and self.config.base_of(name) == name:
                self.lora_sets.pop(name, None)  # a model's own name with none: as configured
            else:
                self.lora_sets[name] = chosen

    def is_ready(self, name: str) -> bool:
        """Whether the model (or an adapter's model) can take a request now, with no load first."""
        if (adapter := self.adapter_target(name)) is not None:
            name = adapter[0]
        runner = self.runners.get(name)
        return runner is not None and runner.state == "ready"

    async def ready_runner(self, name: str) -> ModelRunner:
        """The model's runner, loading it first when the strategy loads on demand.

        Raises KeyError (unknown model), NotReady, PolicyRefused, InsufficientMemory or TimeoutError.
        """
        if (adapter := self.adapter_target(name)) is not None:
            return AdaptedRunner(await self._ready_model(adapter[0]), name, adapter[1])
        return await self._ready_model(name)

    async def _ready_model(self, name: str) -> ModelRunner:
        runner = self.runners[name]
        self.last_used[name] = self.asked_at[name] = time.monotonic()
        self._janitor_wake.set()  # from its idle pace to the busy one
        if runner.state == "ready":
            return runner
        if runner.state == "failed" and not self.policy.loads_on_demand:
            raise NotReady(runner.error or "failed")
        if runner.state == "loading" and not self.policy.loads_on_demand:
            raise NotReady("loading")
        if not self.policy.loads_on_demand:
            raise NotReady(f"not loaded; policy {self.policy.name} loads models at boot only")
        runner = await self.load_async(name, self.config.policy.load_timeout_s)
        if runner.state != "ready":
            raise NotReady(runner.error or runner.state)
        self.last_used[name] = self.asked_at[name] = time.monotonic()
        return runner

    def _janitor(self) -> None:
        """Adaptive KV changes; and, where models load on demand, unloads idle models past their
        keep-alive and idle unpinned ones above the low watermark."""
        while True:
            try:
                wait = self._janitor_wait()
            except Exception:  # a strategy plugin's keep-alive raised: its pass below reports it
                wait = JANITOR_BUSY_S
            self._janitor_wake.wait(wait)
            self._janitor_wake.clear()
            if self._stop.is_set():
                return
            try:
                with self._lock:
                    self._spill_prefixes()
                    adapting = self._adapt_kv()
                    if not self.policy.loads_on_demand:
                        continue
                    now = time.monotonic()
                    for name, r in list(self.runners.items()):
                        ka = self.idle_limit_s(name)
                        idle_since = self._idle_since(name, now)
                        if (ka is not None and r.state == "ready" and not self._in_use(name)
                                and now - idle_since > ka and not self._preparing(name, now)):
                            self._unload(name, f"evicted after {ka:g}s idle (keep_alive)")
                    for budget in {b.scope: b for b in map(self.budget, list(self.runners))}.values():
                        if self.used(budget) <= budget.low or budget.scope in adapting:
                            continue  # a KV downgrade under way may be enough: see after it
                        limit = self.policy.on_memory_pressure("low", self._candidates(budget, ""))
                        evicted = 0
                        while self.used(budget) > budget.low and (limit is None or evicted < limit):
                            victim = self._choose_victim(budget, "")
                            if victim is None:
                                break
                            self._unload(victim, "evicted above the low watermark")
                            evicted += 1
            except Exception:
                log.exception("janitor pass failed")

    def _janitor_wait(self) -> float:
        """Seconds to the janitor's next pass: JANITOR_BUSY_S while a model works, loads, is
        being prepared for or changes KV types; while all are idle, nothing it watches moves
        but the clock, so it sleeps until the first keep-alive runs out (at most JANITOR_IDLE_S)."""
        now = time.monotonic()
        wait = JANITOR_IDLE_S
        for name, r in list(self.runners.items()):
            if (r.state == "loading" or r.running() or r.queue_depth() or name in self._kv_changing
                    or (r.state == "ready" and self._preparing(name, now))):
                return JANITOR_BUSY_S
            if r.state == "ready" and (limit := self.idle_limit_s(name)) is not None:
                left = self._idle_since(name, now) + limit - now
                # past due and still loaded (its strategy kept it): the busy pace, as before
                wait = min(wait, left if left > 0 else JANITOR_BUSY_S)
        return max(0.05, wait)

    def apply_config(self, config: Config, added: list[str]) -> list[str]:
        """Take a reloaded config: new models get runners (loaded now if the strategy boots them)."""
        with self._lock:
            for name in list(self.lora_sets):  # a posted set holds while the adapters it names do
                before, now = self.config.model(self.config.base_of(name)), config.model(config.base_of(name))
                if before is None or now is None or before.name != now.name or before.lora != now.lora:
                    del self.lora_sets[name]
            self.config = config
            self.policy.reconfigure(config)
            self.kv_controller = self._kv_controller(config)
            self._group_of = {}
            for g in config.groups:
                for m in g.models:
                    self._group_of.setdefault(config.base_of(m), g)
            # Decide auto KV types again (the budget or the set of models may have changed); a
            # model that is not loaded takes its new choice now, a loaded one at its next load.
            self.kv_choices = self._choose_kv()
            for name, runner in list(self.runners.items()):
                if (now := config.model(name)) is not None:
                    runner.cfg = live_fields(runner.cfg, now)  # read at each request
                if runner.state == "unloaded" and self._with_kv_choice(runner.cfg) != runner.cfg:
                    self.runners[name] = self._new_runner(runner.cfg)
            for name in added:
                if name not in self.runners:  # (added once, whatever a caller asks)
                    self.runners[name] = self._new_runner(config.model(name))
        # the strategy's boot set as the new config has it: an added model, one a new pinned group
        # names that was not loaded (it stayed unloaded, /health degraded, until a request), and
        # one whose load failed (refused for memory before the budget grew, say: under
        # fixed-appliance nothing but a restart loaded it again)
        boot = [n for n in self.boot_models()
                if n in added or (n in self.runners and self.runners[n].state in ("unloaded", "failed"))]
        for name in boot:
            threading.Thread(target=self._load_quietly, args=(name,), daemon=True).start()
        return added

    def _load_quietly(self, name: str) -> None:
        if self._stop.is_set():  # stopping: the boot set's later models are not started
            return
        try:
            self.load(name, boot=True)
        except (InsufficientMemory, PolicyRefused) as e:
            runner = self.runners[name]
            runner.state, runner.error = "failed", str(e)
            log.error("model %s not loaded: %s", name, e)
            self.counters["load_failures"] += 1  # (a boot load refused for memory fails as any failed load)
            self._event("load_failed", name, runner.error)

    # ---- views -----------------------------------------------------------------------------

    def get(self, name: str) -> ModelRunner | None:
        return self.runners.get(name)

    def states(self) -> dict[str, tuple[str, str | None]]:
        return {name: (r.state, r.error) for name, r in self.runners.items()}
