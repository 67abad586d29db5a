"""ModelRunner: one llama_model + llama_context, one OS thread, continuous batching.

Step loop: admit waiting requests into free sequence slots → drop cancelled or expired ones →
build one batch (one token per decoding sequence, then prompt chunks of prefilling sequences up
to n_batch tokens, so a long prompt never stalls the others) → llama_decode with cores taken
from the process budget → sample each sequence that produced logits → emit text.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import hashlib
import heapq
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, TypeVar

import llama_cpp as lc
import numpy as np

from ..config import ModelConfig
from ..kv import migrate
from .prefix import PrefixCache, build_id
from ..resources import file_facts, heap, outputs
from ..resources.cores import CoreBudget
from . import held_gil, native, priority
from .adapter_turns import AdapterTurns
from .adapters import BASE, AdapterSet, AdapterSwitch, LoadedAdapter, identity as adapter_identity, load as load_adapters
from .decode import decode_with_cores
from .load_cancel import LoadCancelled, raise_if_set
from .chat_template import ChatTemplate, default_template
from .reasoning import BudgetWatch
from .grammar import Constraint, GrammarError
from .sampling import SamplingParams, build_chain, free_chain
from .speculative.exactness import BATCH_INVARIANT_ROWS, CONTEXTS as EXACTNESS_CONTEXTS, exact_rows
from .speculative.ngram import PredictionIndex
from .speculative.speculator import SeqDrafts, Speculator
from .text import TextStream
from .context_swap import ContextLost, MigrationReverted
from . import context_swap
from .token_pick import TokenPicker

T = TypeVar("T")
log = logging.getLogger("eie.runner")

# One exactness probe at a time per key (model file, build, KV types, ...): ModelRunner._measure_exact_rows
_SAME_PROBE: dict[tuple, threading.Lock] = {}
_SAME_PROBE_LOCK = threading.Lock()


@dataclass
class GenerationRequest:
    prompt: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop: list[str] = field(default_factory=list)
    deadline: float = float("inf")  # time.monotonic() value
    logprobs: bool = False  # report the mean log-probability of the sampled tokens
    # Per-token log-probabilities with this many alternatives each (None: none).
    top_logprobs: int | None = None
    # Score the prompt: each prompt token's log-probability after the tokens before it, with this
    # many alternatives (None: not scored). The prefill then goes in chunks of at most the
    # context's output rows, and no cached prefix is restored (every position's logits are needed).
    prompt_logprobs: int | None = None
    # Prefix cache: keep the finished request's context for a next turn (off for warm-ups).
    save_conversation: bool = True
    # Speculative decoding, where the model has it configured (false: this request opts out).
    speculative: bool = True
    # The answer the client expects (OpenAI's predicted outputs): a draft source of its own.
    predicted: PredictionIndex | None = None
    # The model's LoRA adapters this sequence decodes with ((index, scale), non-zero scales,
    # ascending index; engine/adapters.py); () the model itself.
    adapters: AdapterSet = BASE


@dataclass(frozen=True)
class TokenLogprob:
    token: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...] = ()


@dataclass(frozen=True)
class TextDelta:
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    generated: int = 0  # tokens the sequence has generated so far (a delta may hold several)
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (as Finished says)


@dataclass(frozen=True)
class PromptScored:
    """A scored prompt (GenerationRequest.prompt_logprobs): entries for its tokens from the second
    on (the first has no context to be predicted from). Sent once, before any text."""

    logprobs: tuple[TokenLogprob, ...]


@dataclass(frozen=True)
class Finished:
    reason: str  # "stop" | "length"
    prompt_tokens: int
    completion_tokens: int
    mean_logprob: float | None = None
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache or a live sequence
    stop_string: str | None = None  # the request's stop string that ended the answer
    reasoning_tokens: int = 0  # tokens generated inside the think block (SamplingParams.think_budget)
    # GenerationRequest.predicted: its tokens verified as drafts and taken, and those refused
    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0
    # time.monotonic() when its first token was sampled: the prompt's prefill ended (its text may
    # have been held back, a stop string may have eaten it); None where it sampled none
    first_token_at: float | None = None


@dataclass(frozen=True)
class Failed:
    kind: str  # "timeout" | "internal" | "cancelled" | "shutdown"
    message: str
    # what the sequence had prefilled and generated when it ended (usage a request that went
    # away, or failed half-way, is accounted)
    prompt_tokens: int = 0
    completion_tokens: int = 0


Event = TextDelta | PromptScored | Finished | Failed
Sink = Callable[[Event], None]


PARK_RETRY_S = 0.5  # how soon a park declined for want of host memory is weighed again


class QueueFull(Exception):
    pass


NotReady = native.NotReady  # (defined beside the vocabulary, which raises it once its model is freed)


def _free_samplers(seq: _Sequence) -> None:
    """Free a sequence's sampler chain and grammar (none: nothing to free)."""
    if seq.chain is not None:
        free_chain(seq.chain)
        seq.chain = None
    if seq.grammar is not None:
        seq.grammar.close()
        seq.grammar = None


def _is_background(seq: "_Sequence") -> bool:
    return seq.background


class _Sequence:
    __slots__ = (
        "req",
        "sink",
        "seq_id",
        "chain",
        "n_prefilled",
        "pos",
        "last_token",
        "n_generated",
        "first_token_at",
        "stream",
        "cancelled",
        "out_index",
        "leader",
        "logprob_sum",
        "pending_logprobs",
        "unsent",
        "unsent_logprobs",
        "prefix_keys",
        "save_at",
        "restored",
        "decoded",
        "spec",
        "rng",
        "argmax",
        "cut_floor",
        "grammar",
        "grammar_rng",
        "prompt_scores",
        "think",
        "forced",
        "migrated",
        "background",
        "parked",
        "park_declined",
        "deadline",
        "since",
        "answered",
    )

    def __init__(self, req: GenerationRequest, sink: Sink):
        self.req = req
        self.sink = sink
        self.answered = False  # its final event went out (it may still be saving its conversation)
        self.background = priority.background.get()  # (read where the request is made: engine/priority.py)
        # Its KV state while it is parked (out of its slot, for an interactive request: priority.py),
        # empty where it had none yet; None while it is not parked.
        self.parked: bytes | bytearray | None = None
        self.park_declined = False  # parking it was declined once for want of host memory (counted once)
        # The request's deadline; a background sequence's moves on by the time it spends out of a
        # slot (waiting or parked), so yielding to interactive work never times it out.
        self.deadline = req.deadline
        self.since = time.monotonic()  # when it last went out of a slot (queued or parked)
        self.seq_id = -1
        self.chain = None
        self.n_prefilled = 0
        self.pos = 0
        self.last_token = -1
        self.n_generated = 0
        self.first_token_at: float | None = None  # time.monotonic() when its first token was sampled
        self.stream: TextStream | None = None
        self.cancelled = False
        self.out_index = -1
        # Another sequence of the same request with the same prompt: its prompt KV is copied
        # instead of prefilled again (fan-out of N samples costs one prefill).
        self.leader: _Sequence | None = None
        self.logprob_sum = 0.0
        # per-token logprobs of tokens whose text is not all out yet (held back as the start of a
        # stop string), each with where its text ends in the answer's characters
        self.pending_logprobs: list[tuple[int, TokenLogprob]] = []
        # Text (and its tokens' logprobs) of this step not sent yet: a step's tokens leave as one
        # event (a verification emits up to 17; each event costs the event loop ~0.14 ms of CPU,
        # on the cores the ggml threads decode on).
        self.unsent: list[str] = []
        self.unsent_logprobs: list[TokenLogprob] = []
        # Prefix cache: block keys of the cacheable prefix (None until looked up), the prompt
        # position where the prefill is cut and the prefix saved, and what was restored.
        self.prefix_keys: list[bytes] | None = None
        self.save_at = 0
        self.restored = 0
        # Its KV went through a live type change (_migrate): its states are not what a cold
        # prefill with the context's types computes, so they never enter the prefix cache nor
        # are copied to another request.
        self.migrated = False
        # With a window-sized sliding-window cache (kv_cache.sliding_window: window) llama.cpp
        # reuses a cell once it falls out of the window of the sequence's last position, so the
        # sequence can be cut back (llama_memory_seq_rm) only to this position or later: its
        # last position before a decode that could have reused cells, plus one. 0: anywhere.
        self.cut_floor = 0
        self.decoded: list[int] = []  # generated tokens fed back into the KV, in order
        self.spec: SeqDrafts | None = None  # speculative state (None: this sequence does not speculate)
        # Sampled sequences that speculate draw with this generator (the rejection rule needs
        # the target's probabilities, so their chain stops before the draw).
        self.rng: np.random.Generator | None = None
        # Plain greedy: numpy's argmax of the logits row instead of the chain, which copies the
        # whole vocabulary into candidates first (0.05 ms against 0.008 for SmolLM2's 49152
        # tokens, per row: a verification of 16 drafts samples 17 rows).
        self.argmax = False
        self.grammar: Constraint | None = None  # the request's grammar (structured output)
        self.grammar_rng: np.random.Generator | None = None  # its redraws after a refused draw
        self.prompt_scores: list[TokenLogprob] | None = [] if req.prompt_logprobs is not None else None
        if self.prompt_scores is not None:
            self.prefix_keys = []  # every position is computed: nothing restored (a save on finish still is)
        budget = req.sampling.think_budget
        self.think = BudgetWatch(budget) if budget is not None else None
        # Tokens the next picks take whatever the logits say: a spent reasoning budget's close.
        self.forced: list[int] = list(budget.close) if self.think is not None and self.think.due_at_start() else []


class Handle:
    """What a caller holds for a submitted request: it can cancel it."""

    __slots__ = ("_seq", "_runner")

    def __init__(self, seq: _Sequence, runner: "ModelRunner"):
        self._seq = seq
        self._runner = runner

    def cancel(self) -> None:
        self._seq.cancelled = True
        self._runner._wake()


class ModelRunner:
    def __init__(self, cfg: ModelConfig, path: Path, cores: CoreBudget,
                 prefix_factory: Callable[["ModelRunner"], PrefixCache | None] | None = None,
                 speculator_factory: Callable[["ModelRunner"], Speculator | None] | None = None,
                 cache_dir: Path | None = None, cancel: threading.Event | None = None,
                 adapter_files: list[tuple[str, Path]] | None = None,
                 control_files: list[tuple[Path, float]] | None = None,
                 preempt_background: bool = True, park_room: Callable[[], int] | None = None):
        self.cfg = cfg
        # Background sequences give their slot to interactive ones that find none (engine/priority.py),
        # where their state fits in the host memory `park_room()` says is free for it (bytes).
        self.preempt_background = preempt_background
        self.park_room = park_room or (lambda: 1 << 62)
        self._park_retry_at = 0.0  # a park declined for room is not weighed again before then
        self.adapter_files = adapter_files or []  # (name, path) of the model's LoRA adapters, in cfg.lora order
        self.control_files = control_files or []  # (path, scale) of the model's control vectors
        self.adapters: list[LoadedAdapter] = []
        self._switch = AdapterSwitch([])
        self._turns = AdapterTurns()  # which adapter set a step decodes, and for how long
        self.cancel = cancel or threading.Event()  # set: a load in progress gives up (engine/load_cancel.py)
        self.cache_dir = cache_dir  # where measured K means are kept (engine/k_centering.py)
        self._prefix_factory = prefix_factory
        self.prefix: PrefixCache | None = None
        self.prefix_error: str | None = None  # why the prefix cache is off at this load, where it failed
        self._speculator_factory = speculator_factory
        self.spec: Speculator | None = None
        self.name = cfg.name
        self.path = path
        self.cores = cores
        self.state = "unloaded"  # unloaded | loading | ready | failed | stopped
        self.error: str | None = None
        self.load_exception: Exception | None = None  # why the load failed
        self.loaded: native.LoadedModel | None = None
        self.vocab: native.Vocab | None = None
        self.template: ChatTemplate | None = None
        self.threads = min(cfg.threads or cores.total, cores.total)
        # Layers llama.cpp offloads where it has a GPU (-1: all); the manager sets it for `auto`.
        self.gpu_layers = -1 if cfg.n_gpu_layers == "auto" else cfg.n_gpu_layers
        self.batch_cap = outputs.batch_cap(cfg)
        self.swa_window = 0  # the sliding window whose cells llama.cpp reuses (native.LoadedModel.swa_window)
        # An embedding model's pooled output, read once loaded: a reranker (pooling rank) gives its
        # classification head's n_cls_out scores, any other the model's embedding width; and the
        # most tokens one input may have (embedding_cap).
        self.reranker = False
        self.rerank_template: str | None = None  # the GGUF's `tokenizer.chat_template.rerank`
        self.embedding_size = 0
        self.embedding_cap = 0
        self.outputs_cap = outputs.max_outputs(cfg)  # llama.cpp's n_outputs_max: no decode asks for more rows
        self._cond = threading.Condition()
        self._waiting: collections.deque[_Sequence] = collections.deque()
        self._active: list[_Sequence] = []
        self._by_id: list[_Sequence] = []
        self._parked: list[_Sequence] = []  # background sequences out of their slot, parked first first
        self._resuming: list[_Sequence] = []  # parked ones given a slot, their state not written back yet
        self._free_ids = list(range(cfg.n_parallel))  # a heap
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._threads_set = self.threads
        self._last_was_step = False  # whether the context's last decode was a step (not a prompt chunk)
        self.load_seconds = 0.0
        # Counters since load (read without locking: plain ints, written by the runner thread).
        self.stats = {"sequences": 0, "prefill_tokens": 0, "decode_tokens": 0, "kv_copies": 0, "kv_migrations": 0,
                      "kv_migration_reverts": 0,
                      "prefix_live_hits": 0, "prefix_ram_hits": 0, "prefix_disk_hits": 0, "prefix_misses": 0,
                      "prefix_tokens_restored": 0, "grammar_sequences": 0, "grammar_masks": 0,
                      "grammar_dead_ends": 0, "prompt_tokens_scored": 0, "embedded_inputs": 0,
                      "reasoning_budget_cuts": 0, "adapter_switches": 0, "background_preemptions": 0,
                      "background_parks_declined": 0}
        # work for the runner thread between two steps, with the future its caller waits on
        self._commands: collections.deque[tuple[Callable[[], None], concurrent.futures.Future]] = collections.deque()
        self.kv_changes: collections.deque[dict] = collections.deque(maxlen=32)  # newest last
        self._decode_times: collections.deque[float] = collections.deque(maxlen=32)  # seconds per decode step
        self.last_finished = 0.0  # time.monotonic() when a sequence last finished
        self.picker: TokenPicker | None = None  # set at the load
        self._exact_stale = False  # exact_rows to be measured by the next step: none cached at load, or KV types changed
    # ---- lifecycle -------------------------------------------------------------------------

    def load(self) -> None:
        """Load weights and context (blocking), then start the step thread."""
        t0 = time.monotonic()
        try:
            raise_if_set(self.cancel)
            self.loaded = native.load(
                self.path,
                n_ctx_total=outputs.kv_cells(self.cfg),
                n_seq_max=self.cfg.n_parallel,
                n_batch=self.batch_cap,
                n_threads=self.threads,
                type_k=self.cfg.kv_cache.type_k,
                type_v=self.cfg.kv_cache.type_v,
                flash_attn=self.cfg.flash_attn,
                center_k=self.cfg.kv_cache.center_k,
                cache_dir=self.cache_dir,
                cores=self.cores,
                cancel=self.cancel,
                n_gpu_layers=self.gpu_layers,
                n_outputs_max=self.outputs_cap,
                swa_full=self.cfg.kv_cache.sliding_window == "full",
                pooling=self.cfg.pooling if self.cfg.embedding else None,
                control_vectors=self.control_files,
                control_layers=self.cfg.control_vector_layers,
            )
            self.swa_window = self.loaded.swa_window
            self.adapters = load_adapters(self.loaded.model, self.adapter_files)
            self._switch = AdapterSwitch(self.adapters)
            if self.cfg.embedding:
                self._read_pooled_shape()
            self.vocab = native.Vocab(self.loaded.vocab, self.loaded.n_vocab)
            self.picker = TokenPicker(self.loaded, self.vocab, self.stats, self.name)
            source = self.cfg.chat_template or default_template(self.loaded.metadata)
            self.template = ChatTemplate(source, self.vocab.bos_text, self.vocab.eos_text)
            if self._speculator_factory is not None and not self.cfg.embedding:  # a draft model with another vocabulary fails the load
                self.spec = self._speculator_factory(self)
            if self.spec is not None and not self._cached_exact_rows():
                # Measured by the step thread's first step instead (1-4 s on 2 cores at a first
                # boot): the model is ready that much sooner, and a request that comes meanwhile
                # waits for that step, which it would have waited for in the load.
                self.spec.exact_rows, self.spec.exact_kv = 1, None
                self._exact_stale = True
            raise_if_set(self.cancel)  # stopping: no prefix cache, no step thread
        except Exception as e:  # a load failure is a state, reported by /health, never a crash
            if self.spec is not None:
                self.spec.close()
                self.spec = None
            if self.loaded:
                self.loaded.free()
                self.loaded = None
            self.fail_load(e, time.monotonic() - t0)
            return
        self._mem = lc.llama_get_memory(self.loaded.ctx)
        self.prefix_error = None
        if self._prefix_factory is not None and not self.cfg.embedding:
            try:
                self.prefix = self._prefix_factory(self)
            except Exception as e:  # the cache is an optimisation: serve without it
                self.prefix_error = f"{type(e).__name__}: {e}"
                log.warning("model %s: prefix cache off: %s", self.name, self.prefix_error)
        self._batch = lc.llama_batch_init(self.batch_cap, 0, 1)
        cap = self.batch_cap
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(cap,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(cap,))
        self._nseq = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(cap,))
        self._logits = np.ctypeslib.as_array(self._batch.logits, shape=(cap,))
        self._seq_ptrs = [self._batch.seq_id[i] for i in range(cap)]
        self._nseq[:] = 1
        self.load_seconds = time.monotonic() - t0
        self._thread = threading.Thread(target=self._run, name=f"runner-{self.name}", daemon=True)
        self.state = "ready"
        self._thread.start()
        log.info("model %s ready in %.2fs", self.name, self.load_seconds)

    def fail_load(self, e: Exception, after_s: float = 0.0) -> None:
        """The load failed (or was never tried, the file being unreadable): a state, not a crash."""
        self.error, self.load_exception = str(e), e
        self.state = "failed"
        if isinstance(e, LoadCancelled):
            log.info("model %s: %s after %.2fs", self.name, e, after_s)
        else:
            log.error("model %s failed to load: %s", self.name, e)

    def _exact_rows_key(self) -> tuple[tuple, int]:
        max_rows = min(self.spec.cfg.max_draft + 1, self.outputs_cap)
        centered = self.loaded.k_centers is not None  # other keys, other rounding
        # not a control vector: it adds one row to every token's state, which changes no order of sums
        return (*file_facts.stat_key(self.path), build_id(), max_rows, self.loaded.type_k, self.loaded.type_v,
                centered, *EXACTNESS_CONTEXTS), max_rows

    def _cached_exact_rows(self) -> bool:
        """Take the exactness probe's answer from the cache dir, when it has one for these KV types."""
        key, max_rows = self._exact_rows_key()
        cached = file_facts.load(self.cache_dir, file_facts.EXACT_VERIFY_ROWS, key)
        if not (isinstance(cached, int) and 1 <= cached <= max_rows):
            return False
        self.spec.exact_rows, self.spec.exact_kv = cached, (self.loaded.type_k, self.loaded.type_v)
        log.info("model %s: speculative verification is exact up to %d tokens per sequence", self.name, cached)
        return True

    def _measure_exact_rows(self, seq_id: int = 0) -> None:
        """How many tokens per sequence one decode verifies exactly (speculative/exactness.py), on
        the free sequence `seq_id`; measured once per model file, llama.cpp build, KV types and K
        centring, then read from the cache dir."""
        if self._cached_exact_rows():
            return
        key, max_rows = self._exact_rows_key()
        # Models that share a file and KV types (names with other templates or settings) measure
        # it once: the others wait for its answer here, instead of each measuring it at once.
        with _SAME_PROBE_LOCK:
            lock = _SAME_PROBE.setdefault(key, threading.Lock())
        while not lock.acquire(timeout=0.1):
            raise_if_set(self.cancel)
        try:
            if self.cache_dir is not None and self._cached_exact_rows():
                return
            t0 = time.monotonic()
            granted = self.cores.acquire(self.threads)
            try:
                self._use_adapters(BASE)
                lc.llama_set_n_threads(self.loaded.ctx, granted, granted)
                self._threads_set = granted
                self.spec.exact_rows = exact_rows(self.loaded.ctx, self.loaded.n_vocab, max_rows, seq_id,
                                                  cancel=self.cancel)
            finally:
                self.cores.release(granted)
            file_facts.save(self.cache_dir, file_facts.EXACT_VERIFY_ROWS, key, self.spec.exact_rows)
        finally:
            lock.release()
        self.spec.exact_kv = (self.loaded.type_k, self.loaded.type_v)
        log.info("model %s: speculative verification is exact up to %d tokens per sequence (measured in %.2fs)",
                 self.name, self.spec.exact_rows, time.monotonic() - t0)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self._thread:
            self._thread.join(timeout=30)
        self._release()
        self.state = "stopped"

    def _release(self) -> None:
        if self.prefix is not None:
            self.prefix.store.close()  # finishes the queued disk writes, drops the RAM tier
        if self.spec is not None:
            self.spec.close()
            self.spec = None
        self.adapters, self._switch = [], AdapterSwitch([])  # llama.cpp frees them with the model
        if self.loaded:  # last: its free() trims the heap, the states dropped above included
            if self.vocab is not None:  # requests tokenizing off this thread finish first; later ones are refused
                self.vocab.close()
            lc.llama_batch_free(self._batch)
            self.loaded.free()
            self.loaded = None
            self.picker = None

    # ---- requests --------------------------------------------------------------------------

    @property
    def adapter_bytes(self) -> int:
        """The LoRA adapters' buffers, as llama.cpp allocated them, and what the compute buffer
        grew by with a set of them (measured at the reserve after a change); and the control vector's."""
        grown = self._switch.compute_peak - self.loaded.buffers.compute if self.loaded is not None else 0
        control = self.loaded.control.nbytes if self.loaded is not None and self.loaded.control is not None else 0
        return sum(a.bytes for a in self.adapters) + max(0, grown) + control

    @property
    def n_ctx(self) -> int:
        return self.cfg.n_ctx

    def submit(self, req: GenerationRequest, sink: Sink) -> Handle:
        """Queue a request; raises NotReady or QueueFull. Events reach `sink` from the runner thread."""
        return self.submit_many([req], [sink])[0]

    def submit_many(self, reqs: list[GenerationRequest], sinks: list[Sink]) -> list[Handle]:
        """Queue several sequences at once (all or none). Sequences whose prompt is the same
        list object share its prefill: the first computes it, the others copy its KV."""
        if self.state != "ready":
            raise NotReady(self.error or self.state)
        if self.cfg.embedding:  # its context pools instead of giving logits (the API refuses such requests first)
            raise NotReady("an embedding model does not generate")
        for r in reqs:  # (the APIs fit prompts first: this keeps a path that did not from failing a whole step)
            if len(r.prompt) >= self.n_ctx:
                raise ValueError(f"a prompt of {len(r.prompt)} tokens does not fit a sequence's context of "
                                 f"{self.n_ctx} tokens with room for an answer")
        seqs = [_Sequence(r, s) for r, s in zip(reqs, sinks)]
        leaders: dict[int, _Sequence] = {}
        for seq in seqs:
            first = leaders.setdefault(id(seq.req.prompt), seq)
            if first is not seq:
                seq.leader = first
        with self._cond:
            if self._stopping:  # the runner thread may have read its queue for the last time
                raise NotReady("the model was unloaded")
            held = len(self._active) + len(self._waiting) + len(self._parked)
            foreground = sum(1 for s in (*self._active, *self._waiting) if not s.background)
            if len(seqs) > priority.queue_room(seqs[0].background, foreground, held - foreground, self.cfg.n_parallel,
                                               self.cfg.max_queue, self.preempt_background):
                raise QueueFull(self.name)
            self._waiting.extend(seqs)
            self._cond.notify_all()
        return [Handle(seq, self) for seq in seqs]

    def warm(self, prompt: list[int], adapters: AdapterSet = BASE) -> "concurrent.futures.Future[dict]":
        """Prefill `prompt` and save its prefix in the prefix cache (one token is generated and
        dropped), computed with `adapters`. The future gets {prompt_tokens, cached_tokens}; raises
        QueueFull/NotReady."""
        fut: concurrent.futures.Future[dict] = concurrent.futures.Future()
        if self.prefix is None:
            fut.set_exception(NotReady("the prefix cache is off for this model"))
            return fut
        cached = len(self.prefix.keys(prompt)) * self.prefix.block

        def sink(event: Event) -> None:
            if isinstance(event, Finished):
                fut.set_result({"prompt_tokens": len(prompt), "cached_tokens": cached})
            elif isinstance(event, Failed):
                fut.set_exception(RuntimeError(event.message))

        self.submit(GenerationRequest(prompt=list(prompt), max_tokens=1, save_conversation=False, adapters=adapters),
                    sink)
        return fut

    def queue_depth(self) -> int:
        with self._cond:
            return len(self._waiting)

    def running(self) -> int:
        return len(self._active)

    def answering(self) -> int:
        """Sequences whose answer has not gone out yet (running() less those only saving their
        conversation for the prefix cache: an unload may wait for that, it loses no answer)."""
        with self._cond:
            return sum(1 for s in self._active if not s.answered)

    def background_counts(self) -> dict[str, int]:
        """Background sequences (a batch's: engine/priority.py) running, waiting (never run yet)
        and parked, and the bytes of KV state the parked ones hold in host memory."""
        with self._cond:
            return {"running": sum(1 for s in self._active if s.background),
                    "queued": sum(1 for s in self._waiting if s.background),
                    "parked": len(self._parked),
                    "parked_bytes": sum(len(s.parked or b"") for s in (*self._parked, *self._resuming))}

    def speculative_stats(self) -> dict | None:
        """Speculative decoding counters (drafted, accepted, acceptance_rate, controller_on, per
        source, ...) as a plain dict; None when the model does not speculate."""
        spec = self.spec
        return spec.snapshot() if spec is not None else None

    def decode_ms(self) -> float | None:
        """Median time of the recent decode steps (None until there are enough of them)."""
        times = list(self._decode_times)
        return float(np.median(times)) * 1000 if len(times) >= 8 else None

    @property
    def kv_types(self) -> tuple[str, str]:
        """The K and V types of the live context (they change when the KV is migrated)."""
        if self.loaded:
            return self.loaded.type_k, self.loaded.type_v
        return self.cfg.kv_cache.type_k, self.cfg.kv_cache.type_v

    def change_kv_types(self, type_k: str, type_v: str, reason: str) -> "concurrent.futures.Future[dict]":
        """Move the KV cache to other types without reloading the weights or re-prefilling.

        Runs on the runner thread between two steps: a new context on the same model, the
        live sequences' states converted into it (appliance.kv.migrate), the old one freed;
        generation continues where it was. The future gets a record of the change, or the
        error that left the old context in place.
        """
        def run() -> dict:
            try:
                return self._migrate(type_k, type_v, reason)
            except Exception as e:  # the old context stays in place
                log.error("model %s: KV change to %s/%s failed: %s", self.name, type_k, type_v, e)
                raise

        return self._between_steps(run)

    def flush_prefix_cache(self) -> "concurrent.futures.Future[None]":
        """Forget the saved prefixes, between two steps: a conversation saved after its answer
        went out (see _finish) is saved before the flush, never after it."""
        if self.prefix is None:
            fut: concurrent.futures.Future[None] = concurrent.futures.Future()
            fut.set_exception(NotReady("the prefix cache is off for this model"))
            return fut
        store = self.prefix.store

        def flush() -> None:
            store.flush()
            heap.trim()

        return self._between_steps(flush)

    def _read_pooled_shape(self) -> None:
        model = self.loaded.model
        self.reranker = lc.llama_pooling_type(self.loaded.ctx) == lc.LLAMA_POOLING_TYPE_RANK
        if self.reranker:
            self.rerank_template = self.loaded.metadata.get("tokenizer.chat_template.rerank")
        self.embedding_size = lc.llama_model_n_cls_out(model) if self.reranker else lc.llama_model_n_embd_out(model)
        # no more than the training context either: an encoder's learned positions end there
        # (llama.cpp aborts past them)
        n_train = lc.llama_model_n_ctx_train(model)
        self.embedding_cap = min(self.batch_cap, n_train) if n_train > 0 else self.batch_cap

    def embed(self, prompts: list[list[int]]) -> "concurrent.futures.Future[list[np.ndarray]]":
        """One pooled embedding (float32, as llama.cpp gives it) per prompt, for an embedding
        model (cfg.embedding); each prompt fits one decode (batch_cap tokens)."""
        return self._between_steps(lambda: self._embed(prompts))

    def _embed(self, prompts: list[list[int]]) -> list[np.ndarray]:
        out: list[np.ndarray] = []
        n_out, cap = self.embedding_size, self.embedding_cap
        too_long = next((p for p in prompts if len(p) > cap), None)
        if too_long is not None:
            raise ValueError(f"a prompt of {len(too_long)} tokens is over this model's {cap}")
        tok, pos, logits, seq_ptrs = self._tok, self._pos, self._logits, self._seq_ptrs
        i = 0
        while i < len(prompts):
            # as many prompts as fit one decode, one sequence each: pooling sums a sequence's
            # token states within one ubatch, so a prompt is never split
            n, seqs = 0, 0
            while i + seqs < len(prompts) and seqs < self.cfg.n_parallel and n + len(prompts[i + seqs]) <= self.batch_cap:
                p = prompts[i + seqs]
                tok[n : n + len(p)] = p
                pos[n : n + len(p)] = np.arange(len(p), dtype=np.int32)
                for k in range(n, n + len(p)):
                    seq_ptrs[k][0] = seqs
                n += len(p)
                seqs += 1
            if seqs == 0:
                raise ValueError(f"a prompt of {len(prompts[i])} tokens does not fit one decode ({self.batch_cap})")
            logits[:n] = 1
            try:
                self._decode(n)
                for s in range(seqs):
                    ptr = lc.llama_get_embeddings_seq(self.loaded.ctx, s)
                    if not ptr:
                        raise RuntimeError("llama.cpp gave no pooled embedding")
                    out.append(np.ctypeslib.as_array(ptr, shape=(n_out,)).copy())
            finally:
                for s in range(seqs):
                    lc.llama_memory_seq_rm(self._mem, s, -1, -1)
            self.stats["prefill_tokens"] += n
            self.stats["embedded_inputs"] += seqs
            i += seqs
        self.last_finished = time.monotonic()  # (the keep-alive counts idleness from here)
        return out

    def _between_steps(self, fn: Callable[[], T]) -> "concurrent.futures.Future[T]":
        """Run `fn` on the runner thread between two steps; its result or error goes to the future."""
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if self.state != "ready":
            fut.set_exception(NotReady(self.error or self.state))
            return fut

        def run() -> None:
            if not fut.set_running_or_notify_cancel():
                return
            try:
                fut.set_result(fn())
            except Exception as e:
                fut.set_exception(e)

        with self._cond:
            if self._stopping:  # the loop has run its last commands, or is about to
                fut.set_exception(NotReady("the model is being unloaded"))
                return fut
            self._commands.append((run, fut))
            self._cond.notify_all()
        return fut

    def _migrate(self, type_k: str, type_v: str, reason: str) -> dict:
        old_k, old_v = self.kv_types
        if (old_k, old_v) == (type_k, type_v):
            return {"from": [old_k, old_v], "to": [type_k, type_v], "sequences": 0, "seconds": 0.0,
                    "reason": reason, "changed": False}
        t0 = time.monotonic()
        moving = [s for s in self._by_id if s.n_prefilled > 0]
        live = [s.seq_id for s in moving]
        moved = [0, 0]

        def count(_seq: int, before: int, after: int) -> None:
            moved[0] += before
            moved[1] += after

        try:
            context_swap.change_kv_types(self.loaded, live, type_k, type_v, count)
        except MigrationReverted:
            self._took_new_context(moving)
            self.stats["kv_migration_reverts"] += 1
            raise
        except ContextLost as e:
            self._lose_context(str(e))
        self._took_new_context(moving)
        self._retype_parked(type_k, type_v)
        for seq in self._by_id:
            if seq.n_prefilled == 0 and seq.prefix_keys is not None:
                seq.prefix_keys = None  # keys of the old types: looked up again under the new ones
        if self.prefix is not None:
            self.prefix.retype(type_k, type_v)
        self.stats["kv_migrations"] += 1
        self._decode_times.clear()  # latency of the old types says nothing about the new ones
        record = {"time": time.time(), "from": [old_k, old_v], "to": [type_k, type_v], "sequences": len(live),
                  "state_bytes_before": moved[0], "state_bytes_after": moved[1],
                  "seconds": round(time.monotonic() - t0, 4), "reason": reason, "changed": True}
        self.kv_changes.append(record)
        if self.spec is not None:
            # Other KV types take other attention kernels, which may not be batch-invariant: until
            # the probe has run for them (the next step with a free sequence), greedy sequences
            # verify no drafts.
            self.spec.exact_rows, self.spec.exact_kv = 1, None
            self._exact_stale = True
        log.info("model %s: KV %s/%s -> %s/%s (%d live sequences, %.3fs): %s", self.name, old_k, old_v,
                 type_k, type_v, len(live), record["seconds"], reason)
        return record

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    # ---- the step loop ---------------------------------------------------------------------

    def _took_new_context(self, moving: list[_Sequence]) -> None:
        """The runner's view of a context that replaced the last one (context_swap): its memory
        handle, no adapters applied yet, the configured threads; `moving` went through a change
        of KV types."""
        self._mem = lc.llama_get_memory(self.loaded.ctx)
        self._switch.new_context()
        for seq in moving:
            seq.migrated = True
        self._threads_set = self.threads
        self._last_was_step = False

    def _lose_context(self, why: str) -> None:
        """The model has no context left (a KV change could make neither one): its sequences end,
        the model is failed, and the loop stops (NoReturn)."""
        log.error("model %s: %s", self.name, why)
        with self._cond:
            lost = list(self._active) + list(self._waiting) + list(self._parked)
            self._active.clear()
            self._waiting.clear()
            self._parked.clear()
            self._resuming.clear()
            self._by_id = []
            self._stopping = True
            self.error, self.state = why, "failed"
        for seq in lost:
            if seq.chain is not None:  # admitted: what it generated goes out
                self._flush(seq)
            _free_samplers(seq)
            seq.sink(Failed("internal", f"generation failed: {why}"))
        raise RuntimeError(why)

    def _run(self) -> None:
        while True:
            with self._cond:
                while (not self._stopping and not self._waiting and not self._active and not self._commands
                       and not self._exact_stale and not self._parked):
                    self._cond.wait()
                if self._stopping:
                    break
                commands = list(self._commands)
                self._commands.clear()
                self._admit_locked()
            self._write_back_resumed()  # before any command: a KV change must find their states in
            for command, fut in commands:
                if self.state == "failed":  # an earlier command lost the context (_lose_context)
                    if fut.set_running_or_notify_cancel():
                        fut.set_exception(NotReady(self.error or "failed"))
                    continue
                command()
            if self._stopping:  # stopping, or the context is lost: no step
                continue
            if self.preempt_background:
                self._preempt()
            try:
                self._step()
            except Exception as e:  # keep serving: fail what was in flight, clear its KV
                log.exception("runner %s step failed", self.name)
                for seq in list(self._active):
                    self._finish(seq, Failed("internal", f"generation failed: {e}"))
        with self._cond:
            pending = list(self._waiting) + list(self._active) + list(self._parked)
            self._waiting.clear()
            self._parked.clear()
            orphaned = list(self._commands)  # asked for just before the stop: never run
            self._commands.clear()
        for _, fut in orphaned:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(NotReady("the model was unloaded before it could run this"))
        for seq in pending:
            if seq.seq_id >= 0:
                self._finish(seq, Failed("shutdown", "server is shutting down"))
            else:
                self._drop_unplaced(seq, Failed("shutdown", "server is shutting down"))
        if self.state == "failed":  # no context left: the weights and the rest go now, not at an unload
            self._release()

    def _admit_locked(self) -> None:
        now = time.monotonic()
        kept: collections.deque[_Sequence] = collections.deque()
        still_parked: list[_Sequence] = []
        for seq in priority.admission_order(self._waiting, self._parked, _is_background):
            if seq.cancelled:  # its request still waits for an end (a client gone, a background response cancelled)
                self._drop_unplaced(seq, Failed("cancelled", "request cancelled"))
                continue
            if now > seq.deadline and not seq.background:
                self._drop_unplaced(seq, Failed("timeout", "request deadline passed while waiting for a sequence slot"))
                continue
            if not priority.may_take_slot(seq.background, len(self._free_ids), self.cfg.n_parallel):
                (kept if seq.parked is None else still_parked).append(seq)
                continue
            if seq.background:
                seq.deadline += now - seq.since
            if seq.parked is not None:  # its samplers and the rest are as it left them: its KV goes back in
                seq.seq_id = heapq.heappop(self._free_ids)
                self._resuming.append(seq)
                self._active.append(seq)
                continue
            params = seq.req.sampling
            if params.grammar is not None:
                try:
                    seq.grammar = Constraint(self.vocab, params.grammar, params.grammar_triggers)
                except GrammarError as e:
                    seq.sink(Failed("invalid_request", f"grammar: {e}"))
                    continue
                self.stats["grammar_sequences"] += 1
            seq.seq_id = heapq.heappop(self._free_ids)  # lowest free id keeps active ids contiguous
            if self.spec is not None and seq.req.speculative:
                seq.spec = self.spec.new_sequence(seq.req.prompt, seq.req.predicted)
                # a grammar draws with the chain: its check-first pick is sample-and-compare,
                # which for the deterministic drafts here is the rejection rule
                if not params.greedy and seq.grammar is None and not params.draws_itself:
                    seq.rng = np.random.default_rng(params.seed)
            seq.chain = build_chain(params, self.loaded.vocab, self.loaded.n_vocab, self.cfg.n_ctx,
                                    draw=seq.rng is None)
            seq.argmax = params.plain_greedy
            seq.stream = TextStream(seq.req.stop)
            self._active.append(seq)
            self.stats["sequences"] += 1
        self._waiting = kept
        self._parked = still_parked
        self._by_id = sorted(self._active, key=lambda s: s.seq_id)

    def _drop_unplaced(self, seq: _Sequence, event: Event) -> None:
        """End a sequence that holds no slot: waiting, or parked (its samplers and state go)."""
        _free_samplers(seq)
        seq.parked = None
        seq.sink(event)

    def _preempt(self) -> None:
        """Park background sequences for the interactive ones that found no slot, and admit
        those. A sequence others copy their prompt from (fan-out) stays: they read its KV."""
        if time.monotonic() < self._park_retry_at:
            return
        with self._cond:
            # every step comes here: the slots (a few) first, the queue only where one could be parked
            candidates = [s for s in self._active if s.background and not s.cancelled]
            if not candidates:
                return
            starved = sum(1 for s in self._waiting if not s.background and not s.cancelled)
            if not starved:
                return
            leaders = {id(s.leader) for s in (*self._active, *self._waiting) if s.leader is not None}
            candidates = [s for s in candidates if id(s) not in leaders]
            chosen = priority.victims(starved, len(self._free_ids), candidates, lambda s: s.pos)
        room = self.park_room() if chosen else 0
        parked = []
        for seq in chosen:
            size = lc.llama_state_seq_get_size(self.loaded.ctx, seq.seq_id) if seq.pos > 0 else 0
            if size > room:  # the host has no room for its state: the interactive request waits
                if not seq.park_declined:
                    seq.park_declined = True
                    self.stats["background_parks_declined"] += 1
                self._park_retry_at = time.monotonic() + PARK_RETRY_S
                continue
            if self._park(seq, size):
                parked.append(seq)
                room -= size
        if parked:
            with self._cond:
                self._admit_locked()
            self._write_back_resumed()

    def _park(self, seq: _Sequence, size: int) -> bool:
        """Move a background sequence out of its slot: its KV state to host memory, its draft KV
        dropped (the draft model catches up from its tokens when it resumes). False where its
        state could not be read (it keeps the slot)."""
        try:
            state = migrate.read_sequence(self.loaded.ctx, seq.seq_id, size) if seq.pos > 0 else bytearray()
        except Exception:
            log.exception("model %s: parking a background sequence failed; it keeps its slot", self.name)
            return False
        self._flush(seq)
        lc.llama_memory_seq_rm(self._mem, seq.seq_id, -1, -1)
        if self.spec is not None:
            self.spec.finished(seq.seq_id, None)
        with self._cond:
            self._active.remove(seq)
            self._by_id.remove(seq)
            heapq.heappush(self._free_ids, seq.seq_id)
            seq.seq_id = -1
            seq.parked = state
            seq.since = time.monotonic()
            self._parked.append(seq)
        self.stats["background_preemptions"] += 1
        return True

    def _write_back_resumed(self) -> None:
        """Write the states of the parked sequences just given a slot back into the KV."""
        while self._resuming:
            seq = self._resuming.pop(0)
            try:
                if seq.parked:
                    migrate.write_sequence(self.loaded.ctx, seq.seq_id, seq.parked)
            except Exception as e:
                log.exception("model %s: resuming a parked sequence failed", self.name)
                seq.parked = None
                self._finish(seq, Failed("internal", f"resuming the parked request failed: {e}"))
                continue
            seq.parked = None

    def _retype_parked(self, type_k: str, type_v: str) -> None:
        """After a change of KV types: the parked states converted to them, as the live ones were."""
        rot = migrate.rotation_sizes(self.loaded.metadata)
        for seq in list(self._parked):
            if not seq.parked:
                continue
            try:
                seq.parked = migrate.convert_bytes(seq.parked, type_k, type_v, rot)
                seq.migrated = True
            except Exception as e:
                log.exception("model %s: converting a parked sequence to %s/%s failed", self.name, type_k, type_v)
                with self._cond:
                    self._parked.remove(seq)
                self._drop_unplaced(seq, Failed("internal", f"the KV change could not convert the parked request: {e}"))

    def _finish(self, seq: _Sequence, event: Event) -> None:
        self._flush(seq)
        if isinstance(event, Failed):
            event = replace(event, prompt_tokens=min(seq.n_prefilled, len(seq.req.prompt)),
                                        completion_tokens=seq.n_generated)
        save = (self.prefix is not None and isinstance(event, Finished) and seq.req.save_conversation
                and self.cfg.kv_cache.prefix.save_on_finish and not seq.migrated)
        if save:
            seq.answered = True
            seq.sink(event)  # the answer goes out first; the save below is off its path
            try:
                self._save_conversation(seq)
            except Exception:  # never lose the answer over the cache
                log.exception("model %s: saving a finished conversation failed", self.name)
        lc.llama_memory_seq_rm(self._mem, seq.seq_id, -1, -1)
        if self.spec is not None:
            self.spec.finished(seq.seq_id, seq.spec if isinstance(event, Finished) else None)
        _free_samplers(seq)
        with self._cond:
            self._active.remove(seq)
            self._by_id.remove(seq)
            heapq.heappush(self._free_ids, seq.seq_id)
        self.last_finished = time.monotonic()
        if not save:
            seq.sink(event)

    def _step(self) -> None:
        """One scheduling step: a decode call for every decoding sequence, then prompt chunks.

        Each prompt chunk is its own llama_decode, cut at the same n_batch boundaries a solo
        run would use, and decode tokens never share a ubatch with a prompt chunk: together
        with one KV stream per sequence, a sequence computes exactly what it would alone, so
        concurrency never changes a greedy answer.
        """
        if self._exact_stale and self._free_ids:
            self._exact_stale = False
            try:
                self._measure_exact_rows(self._free_ids[0])  # the lowest free id: not admitted
            except LoadCancelled:  # the server is stopping
                pass
            except Exception:  # greedy sequences keep verifying no drafts
                log.exception("model %s: measuring exact verification for its KV types failed", self.name)
        now = time.monotonic()
        for seq in list(self._active):
            if seq.cancelled:
                self._finish(seq, Failed("cancelled", "request cancelled"))
            elif now > seq.deadline:
                self._finish(seq, Failed("timeout", "request deadline passed during generation"))
        chosen = self._step_adapters()
        decoding = [s for s in self._by_id if s.n_prefilled >= len(s.req.prompt) and s.req.adapters == chosen]
        if decoding:
            t_step = time.perf_counter()
            speculating = [s for s in decoding if s.spec is not None]
            speculate = bool(speculating) and self.spec.controller.speculate(len(decoding))
            if speculate:
                self._propose(decoding, speculating)
            t_proposed = time.perf_counter()
            tok, pos, logits, seq_ptrs = self._tok, self._pos, self._logits, self._seq_ptrs
            n = 0
            widths = set()  # rows per sequence: unequal ones make llama.cpp split the batch
            for seq in decoding:  # ascending ids: consecutive ids share one ubatch
                drafts = seq.spec.pending if seq.spec is not None else ()
                widths.add(1 + len(drafts))
                seq.out_index = n
                seq.decoded.append(seq.last_token)
                self._may_reuse_cells(seq, seq.pos)
                # the regular token, then the drafts after it: verified in this same decode
                for i, t in enumerate((seq.last_token, *drafts)):
                    tok[n] = t
                    pos[n] = seq.pos + i
                    seq_ptrs[n][0] = seq.seq_id
                    logits[n] = 1
                    n += 1
                seq.pos += 1
            # a decode right after a prompt chunk is slowed by the chunk as much as by the change of
            # width: the cost model learns switch costs from step-to-step changes only
            before = self.spec.costs.previous if self.spec is not None and self._last_was_step else None
            switched = self._use_adapters(chosen)
            t0 = time.perf_counter()
            self._decode(n, step=True)
            took = time.perf_counter() - t0
            self._decode_times.append(took)
            self.stats["decode_tokens"] += n
            if self.spec is not None and len(widths) == 1 and not switched:  # a switch's reserve is no step cost
                # one pass over the weights: the cost line's data, by the decode's sequences (planner.py)
                self.spec.costs.observe(len(decoding), n, took, before)
            drafted = n > len(decoding)
            emitted = self._sample(decoding)
            if speculating:
                took_step = time.perf_counter() - t_step
                # a step whose plan declined every draft was a plain step and the lookups
                plain = took_step - (t_proposed - t_step) if speculate and not drafted else None
                self.spec.controller.record(len(decoding), speculate, took_step, emitted, plain)
                if drafted and len(decoding) == 1:
                    self.spec.lone_step(decoding[0].spec, took_step, emitted)
                self.spec.stats["spec_steps" if drafted else "plain_steps"] += 1
        budget = self.batch_cap
        for seq in list(self._active):  # prompt chunks, oldest request first
            remaining = len(seq.req.prompt) - seq.n_prefilled
            if remaining <= 0 or seq.req.adapters != chosen:
                continue
            if seq.leader is not None:
                if self._follow(seq):
                    continue  # the leader is still prefilling: wait for its KV
                remaining = len(seq.req.prompt) - seq.n_prefilled
            elif self.prefix is not None and seq.prefix_keys is None:
                self._prefix_start(seq)
                remaining = len(seq.req.prompt) - seq.n_prefilled
            take = min(self.batch_cap, remaining)
            if seq.prompt_scores is not None:
                take = min(take, self.outputs_cap)  # a row of logits for every token
            if seq.save_at > seq.n_prefilled:
                take = min(take, seq.save_at - seq.n_prefilled)  # cut where the prefix is saved
            if take > budget and budget < self.batch_cap:
                break  # the step's token budget is spent; the next step continues
            self._prefill_chunk(seq, take)
            budget -= take
            if self.prefix is not None and seq.n_prefilled == seq.save_at > seq.restored and not seq.migrated:
                raw = self.prefix.save(self.loaded.ctx, seq.seq_id, seq.prefix_keys)
                if self.prefix.prunes(seq.save_at):
                    # continue from the state as a hit restores it (same cells, same sums), and
                    # never cut back below it: its window layers no longer hold the older cells
                    self.prefix.settle(self.loaded.ctx, self._mem, seq.seq_id, raw)
                    seq.cut_floor = max(seq.cut_floor, seq.save_at)
            if seq.n_prefilled == len(seq.req.prompt):
                if seq.prompt_scores is not None:
                    seq.sink(PromptScored(tuple(seq.prompt_scores)))
                    seq.prompt_scores = None
                if seq.req.max_tokens == 0:  # the prompt scored, nothing generated (echo)
                    self._finish(seq, self._finished(seq, "length"))
                else:
                    self._sample([seq])

    def _use_adapters(self, chosen: AdapterSet) -> bool:
        """Set `chosen` on the context; whether that changed it."""
        if self._switch.use(self.loaded.ctx, chosen):
            self.stats["adapter_switches"] += 1
            return True
        return False

    def _step_adapters(self) -> AdapterSet:
        """The adapter set whose sequences this step runs (llama.cpp applies adapters to the whole
        context): sets take turns (engine/adapter_turns.py), and a lone set never switches."""
        return self._turns.choose({s.req.adapters for s in self._active}, self._switch.current)

    def _propose(self, decoding: list[_Sequence], speculating: list[_Sequence]) -> None:
        """Drafts for the speculating sequences, within the batch, max_tokens and n_ctx; the
        step stays under the rows where kernels stop being batch-invariant (exactness.py)."""
        share = (min(self.batch_cap, BATCH_INVARIANT_ROWS - 1, self.outputs_cap) - len(decoding)) // len(speculating)
        jobs = []
        for seq in speculating:
            # the regular token is at seq.pos; drafts follow it, and the step emits up to k + 1 tokens
            room = min(share, seq.req.max_tokens - seq.n_generated - 1, self.cfg.n_ctx - seq.pos - 1)
            if seq.rng is None:  # greedy: only as many rows as the kernels compute exactly
                room = min(room, self.spec.exact_rows - 1)
            jobs.append((seq.seq_id, seq.spec, room))
        self.spec.propose(jobs, len(decoding))

    def _prefix_start(self, seq: _Sequence) -> None:
        """Find the prompt's cached prefix: in a live sequence, or saved (RAM, then disk)."""
        prefix = self.prefix
        keys = prefix.keys(seq.req.prompt, self._adapter_identity(seq))
        seq.prefix_keys = keys
        seq.save_at = len(keys) * prefix.block
        if not keys:
            return
        best, donor = 0, None
        for other in self._active:
            if other is seq or not other.prefix_keys or other.seq_id < 0 or other.migrated:
                continue
            n = 0
            for a, b in zip(keys, other.prefix_keys):
                if a != b:
                    break
                n += 1
            n = min(n, other.n_prefilled // prefix.block)
            if n * prefix.block < other.cut_floor:
                continue  # cutting its copy back there would lose window cells llama.cpp reused
            if n > best:
                best, donor = n, other
        if donor is not None:
            n_tokens = best * prefix.block
            # across KV streams llama.cpp copies whole sequences only: copy, then cut
            lc.llama_memory_seq_cp(self._mem, donor.seq_id, seq.seq_id, -1, -1)
            lc.llama_memory_seq_rm(self._mem, seq.seq_id, n_tokens, -1)
            seq.cut_floor = donor.cut_floor
            seq.n_prefilled = seq.pos = seq.restored = n_tokens
            self.stats["prefix_live_hits"] += 1
            self.stats["prefix_tokens_restored"] += n_tokens
            if n_tokens == seq.save_at or prefix.store.contains(keys):
                return
        n_tokens, tier = prefix.restore(self.loaded.ctx, self._mem, seq.seq_id, keys, self.kv_types)
        if tier is None:
            if donor is None:
                self.stats["prefix_misses"] += 1
            return
        if n_tokens > seq.n_prefilled:
            seq.n_prefilled = seq.pos = seq.restored = n_tokens
            # what the saved state lost before is unknown (window-sized cache), or its window layers
            # lack the cells that fell out of the window (llama.cpp leaves them out of a state)
            seq.cut_floor = n_tokens if self.swa_window or prefix.prunes(n_tokens) else 0
            self.stats[f"prefix_{tier}_hits"] += 1
            self.stats["prefix_tokens_restored"] += n_tokens

    def _save_conversation(self, seq: _Sequence) -> None:
        """After a request: keep its whole context (prompt and answer) for the next turn."""
        prefix = self.prefix
        tokens = seq.req.prompt + seq.decoded
        n_tokens = len(tokens) // prefix.block * prefix.block
        if n_tokens <= seq.save_at or n_tokens < seq.cut_floor:
            return  # nothing new, or the window cells the cut would keep may have been reused
        lc.llama_memory_seq_rm(self._mem, seq.seq_id, n_tokens, -1)
        prefix.save(self.loaded.ctx, seq.seq_id, prefix.keys_of(tokens[:n_tokens], self._adapter_identity(seq)))

    def _adapter_identity(self, seq: _Sequence) -> bytes:
        """What the sequence's KV depends on beyond the model file (prefix cache keys): its adapter
        set and the model's control vector (b"" for neither)."""
        own = adapter_identity(self.adapters, seq.req.adapters)
        control = self.loaded.control
        if control is None:
            return own
        return hashlib.blake2b(control.identity + own, digest_size=16).digest()

    def _follow(self, seq: _Sequence) -> bool:
        """Take the leader's prompt KV once it exists; True while the follower must wait."""
        leader = seq.leader
        if leader.cancelled or (leader.seq_id >= 0 and leader.chain is None):
            seq.leader = None  # the leader is gone: prefill alone
            return False
        if leader.chain is None or leader.n_prefilled < len(leader.req.prompt):
            return True  # not admitted yet, or still prefilling
        # Copy everything but the last prompt token, whose logits this sequence computes itself.
        last = len(seq.req.prompt) - 1
        lc.llama_memory_seq_cp(self._mem, leader.seq_id, seq.seq_id, -1, -1)
        lc.llama_memory_seq_rm(self._mem, seq.seq_id, last, -1)  # the leader's last chunk began at or before it
        seq.cut_floor = leader.cut_floor
        seq.migrated = leader.migrated
        self.stats["kv_copies"] += 1
        seq.n_prefilled = last
        seq.leader = None
        return False

    def _may_reuse_cells(self, seq: _Sequence, start: int) -> None:
        """A decode writes the sequence's cells from position `start` on: with a window-sized
        sliding-window cache it may reuse cells that fell out of the window of position start - 1,
        those at or before start - window (llama.cpp's find_slot), and a later cut must keep every
        position up to start - 1 for the cells it needs to be there."""
        if self.swa_window and start >= self.swa_window:
            seq.cut_floor = start

    def _prefill_chunk(self, seq: _Sequence, take: int) -> None:
        start = seq.n_prefilled
        self._may_reuse_cells(seq, start)
        tok, pos, logits, seq_ptrs = self._tok, self._pos, self._logits, self._seq_ptrs
        tok[:take] = seq.req.prompt[start : start + take]
        pos[:take] = np.arange(start, start + take, dtype=np.int32)
        logits[:take] = 0
        sid = seq.seq_id
        for i in range(take):
            seq_ptrs[i][0] = sid
        seq.n_prefilled += take
        seq.pos = seq.n_prefilled
        scores = seq.prompt_scores
        if scores is not None:
            logits[:take] = 1
        if seq.n_prefilled == len(seq.req.prompt):
            logits[take - 1] = 1
            seq.out_index = take - 1
        self._use_adapters(seq.req.adapters)
        self._decode(take)
        self.stats["prefill_tokens"] += take
        if scores is not None:
            prompt, k = seq.req.prompt, seq.req.prompt_logprobs
            for i in range(min(take, len(prompt) - start - 1)):  # row i predicts the token after it
                token = prompt[start + i + 1]
                scores.append(self._entry(self.vocab.piece(token), *self.picker.logprobs(i, token, k)))
            self.stats["prompt_tokens_scored"] += take

    def _decode(self, n_tokens: int, step: bool = False) -> None:
        self._batch.n_tokens = n_tokens
        self._last_was_step = step
        # after a change of adapter set llama.cpp reserves in this decode: its report is read
        reserving = self._switch.reserve_pending
        with native.log_capture() if reserving else contextlib.nullcontext() as lines:
            rc, self._threads_set = decode_with_cores(self.loaded.ctx, self._batch, self.cores, self.threads,
                                                      self._threads_set)
        if reserving and (reserve_s := self._switch.reserved(lines)) is not None:
            self._turns.switched(reserve_s)
        if self.spec is not None:
            self.spec.costs.previous = n_tokens  # what the next decode switches from (planner.StepCosts)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _sample(self, seqs: list[_Sequence]) -> int:
        """Sample each sequence at its logits rows; a sequence with drafts takes them while the
        target agrees (greedy: the same token; sampled: the rejection rule), then one token of
        its own. Rejected drafts leave the KV. Returns the number of tokens emitted."""
        emitted = 0
        for seq in seqs:
            st = seq.spec
            drafts = st.pending if st is not None else []
            accepted = 0
            for i in range(len(drafts) + 1):
                row = seq.out_index + i
                draft = drafts[i] if i < len(drafts) else None
                token, agreed = self.picker.pick(seq, row, draft)
                emitted += 1
                if draft is not None and st.source == "prediction":  # before _take: the end reports them
                    if agreed:
                        st.prediction_counts[0] += 1
                    else:  # this draft and the ones after it
                        st.prediction_counts[1] += len(drafts) - i
                if not self._take(seq, token, row):
                    break  # finished (end of generation, stop string, a limit)
                if not agreed:
                    seq.last_token = token
                    break
                accepted += 1  # the draft is in the KV already: it becomes part of the sequence
                seq.decoded.append(token)
                seq.pos += 1
            if drafts:
                if seq.chain is not None and accepted < len(drafts):
                    held_gil.memory_seq_rm(self._mem, seq.seq_id, seq.pos, -1)
                self.spec.verified(st, accepted)
            self._flush(seq)
        return emitted

    def _take(self, seq: _Sequence, token: int, row: int) -> bool:
        """Emit one sampled token; False when the sequence finished with it."""
        vocab = self.vocab
        per_token = seq.req.top_logprobs is not None
        if seq.req.logprobs or per_token:
            lp, top = self.picker.logprobs(row, token, seq.req.top_logprobs or 0)
            seq.logprob_sum += lp
        if seq.first_token_at is None:
            seq.first_token_at = time.monotonic()
        if vocab.is_eog(token):
            self._emit_end(seq, "stop")
            return False
        seq.n_generated += 1
        if seq.spec is not None:
            seq.spec.tokens.append(token)
        piece = vocab.piece(token, token in seq.req.sampling.shown_tokens)
        if seq.think is not None and seq.think.push(piece.decode("utf-8", "replace")):
            seq.forced = list(seq.req.sampling.think_budget.close)
            self.stats["reasoning_budget_cuts"] += 1
        # (a grammar that holds the text, a lazy one once triggered: a stop string in a tool call or
        # a JSON answer would cut it short of what it must be)
        text, hit_stop = seq.stream.push(piece, stops=seq.grammar is None or seq.grammar.waiting)
        if per_token:
            seq.pending_logprobs.append((seq.stream.decoded, self._entry(piece, lp, top)))
        if text:
            self._emit(seq, text)
        if hit_stop:
            seq.pending_logprobs.clear()  # the stop string's tokens are not part of the answer
            self._finish(seq, self._finished(seq, "stop"))
            return False
        if seq.n_generated >= seq.req.max_tokens or seq.pos >= self.cfg.n_ctx:
            self._emit_end(seq, "length")
            return False
        seq.last_token = token
        return True

    def _emit(self, seq: _Sequence, text: str) -> None:
        """Text that is final (past any stop string's hold-back), with its tokens' logprobs; it
        leaves with the step's other text (`_flush`)."""
        seq.unsent.append(text)
        out = 0  # the tokens whose text is all out now go with it
        while out < len(seq.pending_logprobs) and seq.pending_logprobs[out][0] <= seq.stream.emitted:
            out += 1
        seq.unsent_logprobs += [entry for _, entry in seq.pending_logprobs[:out]]
        del seq.pending_logprobs[:out]

    def _flush(self, seq: _Sequence) -> None:
        if seq.unsent or seq.unsent_logprobs:
            event = TextDelta("".join(seq.unsent), tuple(seq.unsent_logprobs), seq.n_generated, seq.restored)
            seq.unsent.clear()
            seq.unsent_logprobs.clear()
            seq.sink(event)

    def _emit_end(self, seq: _Sequence, reason: str) -> None:
        rest = seq.stream.finish()
        if rest or seq.pending_logprobs:
            self._emit(seq, rest)
        self._finish(seq, self._finished(seq, reason))

    def _finished(self, seq: _Sequence, reason: str) -> Finished:
        mean = None
        if seq.req.logprobs:
            mean = seq.logprob_sum / max(1, seq.n_generated + (1 if reason == "stop" else 0))
        return Finished(reason, len(seq.req.prompt), seq.n_generated, mean, seq.restored,
                        seq.stream.matched_stop if seq.stream is not None else None,
                        seq.think.count if seq.think is not None else 0,
                        *(seq.spec.prediction_counts if seq.spec is not None else (0, 0)), seq.first_token_at)

    def _entry(self, piece: bytes, logprob: float, top: list[tuple[int, float]]) -> TokenLogprob:
        """A token's logprobs entry (`piece`: its text), its alternatives named by their pieces."""
        return TokenLogprob(piece, logprob, tuple((self.vocab.piece(t), v) for t, v in top))
