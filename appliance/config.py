"""YAML configuration → immutable msgspec Structs, with every problem reported by key path.

msgspec stops at the first error, so `load_config` first walks the raw YAML against the
schema (unknown keys, types, bounds, allowed values) and collects one message per problem,
then runs the cross-field checks, and only then converts.
"""

from __future__ import annotations

import os

import json
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, get_args

import msgspec
import yaml
from msgspec import Meta, Struct, field
from msgspec import inspect as mi

KvType = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "turbo4", "turbo3", "turbo2"]
# `auto`: the manager picks the type from the memory budget (resources/kv_choice.py).
KvMode = Literal["f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "turbo4", "turbo3", "turbo2",
                 "auto"]
FlashAttn = Literal["auto", "on", "off"]
_STRATEGY_PATTERN = r"^(generic|pinned-group|multi-group|fixed-appliance|plugin:[^\s]+)$"
Strategy = Annotated[str, Meta(pattern=_STRATEGY_PATTERN)]

Port = Annotated[int, Meta(ge=1, le=65535)]
PositiveInt = Annotated[int, Meta(ge=1)]
ModelName = Annotated[str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._:-]*$")]


class PrefixCacheConfig(Struct, frozen=True, forbid_unknown_fields=True):
    """Reuse of prompt prefixes: live sequences, saved states in RAM, and the disk tier."""

    enabled: bool = True
    # Prefixes are matched in whole blocks of this many tokens.
    block_tokens: Annotated[int, Meta(ge=4, le=4096)] = 16
    # RAM tier size per model.
    ram_mb: Annotated[int, Meta(ge=0, le=1_048_576)] = 256
    # Keep a finished request's whole context (prompt and answer) for the conversation's next turn.
    save_on_finish: bool = True
    # Prompts whose prefix is prefilled and saved when the model loads (e.g. system prompts).
    warm: list[str] = []


KvCompress = Literal["turbo4", "turbo3", "turbo2"]


class KvDiskConfig(Struct, frozen=True, forbid_unknown_fields=True):
    """The prefix cache's disk tier (meant for NVMe); it survives restarts."""

    enabled: bool = True
    # Directory; default <server.cache_dir>/kv.
    path: str | None = None
    max_mb: Annotated[int, Meta(ge=1, le=16_777_216)] = 4096
    # Store f16/q8_0 states TurboQuant-compressed (null: as llama.cpp wrote them).
    compress: KvCompress | None = None
    # Directories of other model identities under `path` (an older GGUF version, KV type or
    # llama.cpp build) unused for this many days are deleted when a model opens its own (0: never).
    prune_after_days: Annotated[float, Meta(ge=0, le=36500)] = 7.0


class KvCacheConfig(Struct, frozen=True, forbid_unknown_fields=True):
    """A model's KV cache: `inference.kv_cache` overlaid key by key with the model's own `kv_cache`.

    `mode: auto` is resolved by the model manager before loading; runners only see concrete types.
    """

    mode: KvMode = "f16"
    # Optional asymmetric override for K (K is more sensitive to quantization than V).
    k: KvType | None = None
    # Allow the KV type to be lowered (and raised again) at run time under memory pressure.
    adaptive: bool = False
    # With adaptive: also step down when the median decode step takes longer than this.
    max_decode_ms: Annotated[float, Meta(gt=0, le=60_000)] | None = None
    # Store keys minus the model's mean key (exact for attention; halves the quantization error
    # of K). Off by itself where it does not apply (soft-capped attention, sinks, GPU offload).
    center_k: bool = True
    # Sliding-window attention layers (Gemma 3's): `full` keeps every cell there as in the other
    # layers; `window` keeps the window plus one batch per sequence, as llama-server does (Gemma 3
    # 270M at 4 x 4096: 108 MiB of f16 KV, not 288), and gives up prefix reuse that would cut a
    # sequence back past cells llama.cpp has since reused (engine/runner.py, cut_floor).
    sliding_window: Literal["full", "window"] = "full"
    prefix: PrefixCacheConfig = field(default_factory=PrefixCacheConfig)
    disk: KvDiskConfig = field(default_factory=KvDiskConfig)

    @property
    def type_k(self) -> str:
        return self.k or self.mode

    @property
    def type_v(self) -> str:
        return self.mode


SpecSource = Literal["ngram", "history", "draft_model"]


class SpeculativeConfig(Struct, frozen=True, forbid_unknown_fields=True):
    """Speculative decoding (appliance/engine/speculative): `inference.speculative` overlaid key by
    key with the model's own `speculative`. No sources: off."""

    # Draft sources, tried in this order for each sequence at each step.
    sources: Annotated[list[SpecSource], Meta(max_length=3)] = []
    # For the draft_model source: a GGUF with the target's vocabulary (a path relative to
    # model_dir, or the name of a configured model whose file is used).
    draft_model: Annotated[str, Meta(min_length=1)] | None = None
    max_draft: Annotated[int, Meta(ge=1, le=64)] = 16
    min_draft: Annotated[int, Meta(ge=1, le=64)] = 1
    # The history source keeps this many recent output tokens per model.
    history_tokens: Annotated[int, Meta(ge=256, le=16_777_216)] = 65536


class LoraAdapterConfig(Struct, frozen=True, forbid_unknown_fields=True):
    """A LoRA adapter of a model (engine/adapters.py): served under its own name as the model's
    weights with this adapter applied, on the model's context beside the model itself."""

    name: ModelName
    # A LoRA GGUF for this model's architecture and shapes (general.type adapter), relative to model_dir.
    path: Annotated[str, Meta(min_length=1)]
    # Multiplies the adapter's alpha / rank; 0 serves the base model's answers.
    scale: Annotated[float, Meta(ge=-16, le=16)] = 1.0


class ControlVectorConfig(Struct, frozen=True, forbid_unknown_fields=True):
    """A control vector file of a model (engine/control_vector.py): F32 `direction.<layer>`
    tensors of the model's width, relative to model_dir."""

    path: Annotated[str, Meta(min_length=1)]
    # Multiplies the file's directions before the model's files are summed.
    scale: Annotated[float, Meta(ge=-1000, le=1000)] = 1.0


class ModelConfig(Struct, frozen=True, forbid_unknown_fields=True):
    name: ModelName
    path: Annotated[str, Meta(min_length=1)]
    # Context length of one sequence; the context holds n_ctx * n_parallel tokens of KV.
    n_ctx: Annotated[int, Meta(ge=256, le=1_048_576)] = 4096
    n_parallel: Annotated[int, Meta(ge=1, le=256)] = 4
    n_batch: Annotated[int, Meta(ge=32, le=8192)] = 512
    threads: Annotated[int, Meta(ge=1, le=512)] | None = None
    kv_cache: KvCacheConfig = field(default_factory=KvCacheConfig)
    flash_attn: FlashAttn = "auto"
    # Layers on the GPU, where llama.cpp offloads (resources/offload.py): auto takes all of them
    # (the repeating layers and the output) when they fit the budget, else the most that fit;
    # a number takes that many (0: weights and KV cache stay in host memory). No effect on a CPU.
    n_gpu_layers: Annotated[int, Meta(ge=0, le=100_000)] | Literal["auto"] = "auto"
    chat_template: str | None = None
    # Variables for the chat template (e.g. {enable_thinking: false} for Qwen3); a request's
    # chat_template_kwargs are laid over them.
    chat_template_kwargs: dict[str, Any] = {}
    # A think block as reasoning_content (auto, deepseek) or left in the content (none), where a
    # request does not say (engine/reasoning.py).
    reasoning_format: Literal["auto", "deepseek", "none"] = "auto"
    # Tokens an answer may spend inside its think block before the server closes it (the
    # message, then </think>) and the answer follows; -1: no bound, 0: closed at once. A
    # request's thinking_budget_tokens (Anthropic's thinking.budget_tokens) overrides it, and a
    # reasoning_effort's entry in reasoning_effort_budgets does where the request names no budget.
    reasoning_budget: Annotated[int, Meta(ge=-1, le=1_048_576)] = -1
    reasoning_budget_message: Annotated[str, Meta(max_length=1024)] = ""
    reasoning_effort_budgets: dict[Literal["low", "medium", "high"], Annotated[int, Meta(ge=-1, le=1_048_576)]] = {}
    # Requests waiting for a sequence slot beyond this are refused with 429.
    max_queue: Annotated[int, Meta(ge=0, le=100_000)] = 64
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)
    # Logits rows one decode may keep, at least (resources/outputs.py): a scored prompt (echo with
    # logprobs) is prefilled this many tokens at a time. 0: the rows decoding needs anyway.
    scoring_rows: Annotated[int, Meta(ge=0, le=8192)] = 0
    # An embedding model: serves /v1/embeddings only (no generation, speculation or prefix cache);
    # each input's token states are pooled into one vector (auto: the GGUF's pooling type, or mean).
    # Its context holds one decode (n_batch tokens; n_ctx is not used), an input at most that.
    # With pooling rank (a cross-encoder's GGUF names it) it serves /v1/rerank instead.
    embedding: bool = False
    pooling: Literal["auto", "mean", "cls", "last", "rank"] = "auto"
    # LoRA adapters loaded with the weights, each served as a model of its own name (at most 16).
    lora: Annotated[list[LoraAdapterConfig], Meta(max_length=16)] = []
    # Control vectors (llama-server's --control-vector-scaled), summed and added to the outputs of
    # control_vector_layers [first, last] (default: every layer from 1), on every request.
    control_vectors: Annotated[list[ControlVectorConfig], Meta(max_length=16)] = []
    control_vector_layers: Annotated[list[Annotated[int, Meta(ge=1, le=100_000)]],
                                     Meta(min_length=2, max_length=2)] | None = None


# Model fields read at each request, not at the load: a reload applies a change to the next request.
LIVE_MODEL_FIELDS = ("reasoning_format", "reasoning_budget", "reasoning_budget_message", "reasoning_effort_budgets",
                     "chat_template_kwargs", "max_queue")


def live_fields(cfg: ModelConfig, new: ModelConfig) -> ModelConfig:
    """`cfg` with `new`'s live fields, and `new`'s LoRA scales where its adapters are the same
    names and files (a scale is applied per request; an adapter added or removed needs a load)."""
    live = {f: getattr(new, f) for f in LIVE_MODEL_FIELDS}
    if [(a.name, a.path) for a in cfg.lora] == [(a.name, a.path) for a in new.lora]:
        live["lora"] = new.lora
    return msgspec.structs.replace(cfg, **live)


class AdaptiveKvConfig(Struct, frozen=True, forbid_unknown_fields=True):
    """How adaptive KV models move between types (appliance/kv/adaptive.py)."""

    # A model changes its KV type at most once per this many seconds.
    cooldown_s: Annotated[float, Meta(ge=0, le=86_400)] = 10.0
    # Pressure must have been gone this long before a model steps back up.
    upgrade_after_s: Annotated[float, Meta(ge=0, le=86_400)] = 30.0
    # Share of the budget that must stay free below the low watermark after a step up.
    margin_percent: Annotated[float, Meta(ge=0, le=50)] = 5.0


class InferenceConfig(Struct, frozen=True, forbid_unknown_fields=True):
    # The default of every model's kv_cache; a model's own kv_cache overrides it key by key.
    kv_cache: KvCacheConfig = field(default_factory=KvCacheConfig)
    kv_adaptive: AdaptiveKvConfig = field(default_factory=AdaptiveKvConfig)
    # The default of every model's speculative; a model's own speculative overrides it key by key.
    speculative: SpeculativeConfig = field(default_factory=SpeculativeConfig)


class ReplaceWith(Struct, frozen=True, forbid_unknown_fields=True):
    replace_with: ModelName


Fallback = Literal["strict", "partial", "retry_once"] | ReplaceWith
GroupType = Literal["parallel", "sequential", "fanout"]
_SELECT_PATTERN = r"^(consensus|logprob|first|judge:[A-Za-z0-9][A-Za-z0-9._:-]*)$"
Select = Annotated[str, Meta(pattern=_SELECT_PATTERN)]


class GroupConfig(Struct, frozen=True, forbid_unknown_fields=True):
    name: ModelName
    models: Annotated[list[ModelName], Meta(min_length=1, max_length=32)]
    type: GroupType = "parallel"
    # parallel/fanout: successful answers needed for the group to succeed (default: all members).
    required_responses: Annotated[int, Meta(ge=1)] | None = None
    pinned: bool = False
    timeout_ms: Annotated[int, Meta(ge=1, le=86_400_000)] = 60_000
    # Per-model override of timeout_ms.
    member_timeout_ms: dict[ModelName, Annotated[int, Meta(ge=1, le=86_400_000)]] = {}
    fallback: Fallback = "partial"
    # fanout only: how the answer is chosen.
    select: Select = "consensus"
    # fanout only: samples drawn from each member model (they share the prompt's KV).
    samples: Annotated[int, Meta(ge=1, le=16)] = 1
    # sequential only: one template per member, `{input}` is the previous output (null: as is).
    prompt_templates: list[str | None] = []
    # With vram.group_isolation (or multi-group): the memory this group's models may use.
    budget_mb: Annotated[int, Meta(ge=1)] | None = None

    def timeout_s(self, model: str) -> float:
        return self.member_timeout_ms.get(model, self.timeout_ms) / 1000.0

    @property
    def replacement(self) -> str | None:
        return self.fallback.replace_with if isinstance(self.fallback, ReplaceWith) else None


class LimitsConfig(Struct, frozen=True, forbid_unknown_fields=True):
    max_body_bytes: Annotated[int, Meta(ge=1024, le=1 << 30)] = 4 * 1024 * 1024
    request_timeout_s: Annotated[float, Meta(gt=0, le=86_400)] = 600.0
    # The largest max_tokens a request may ask for (null: up to the context).
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    # The longest prompt, in tokens, a request may send (null: up to the context).
    max_prompt_tokens: Annotated[int, Meta(ge=1)] | None = None
    # Per API key (or per client address without keys): requests per minute, and at once.
    rate_per_minute: Annotated[int, Meta(ge=1)] | None = None
    concurrent_requests: Annotated[int, Meta(ge=1)] | None = None


class ResponsesConfig(Struct, frozen=True, forbid_unknown_fields=True):
    """What the Responses API keeps for GET /v1/responses/{id} and previous_response_id."""

    # Stored responses at most (0: none is stored); the least recently used go first.
    max_entries: Annotated[int, Meta(ge=0, le=1_000_000)] = 1000
    # Their size at most: the JSON of each response, its input and its turns.
    max_mb: Annotated[int, Meta(ge=1, le=65536)] = 64
    # Also write them under <state_dir>/responses, so that a restart reads them back.
    persist: bool = True


class FilesConfig(Struct, frozen=True, forbid_unknown_fields=True):
    """The Files API's uploads (batch input files) and the Batch API's output files, kept under
    <state_dir>/files."""

    # One upload at most.
    max_file_mb: Annotated[int, Meta(ge=1, le=65536)] = 256
    # All files together at most (an upload, or a batch's output, past it is refused or fails).
    max_mb: Annotated[int, Meta(ge=1, le=1 << 20)] = 2048


class BatchesConfig(Struct, frozen=True, forbid_unknown_fields=True):
    """The Batch API: a file of requests run in the background, at a lower priority than others."""

    # A batch's requests in flight at once (each also waits behind every interactive request).
    concurrent_requests: Annotated[int, Meta(ge=1, le=256)] = 2
    # An interactive request that finds every slot taken parks a batch's sequence (its KV state
    # to host memory) and takes its slot; the parked one resumes where it stopped. false: it waits.
    preempt: bool = True


MetricsAuth = Literal["open", "key", "admin"]
LogFormat = Literal["json", "text"]


class ServerConfig(Struct, frozen=True, forbid_unknown_fields=True):
    host: Annotated[str, Meta(min_length=1)] = "127.0.0.1"
    port: Port = 8080
    api_keys: list[Annotated[str, Meta(min_length=8)]] = []
    # Keys for /v1/admin/*; when empty, the API keys grant admin access too.
    admin_keys: list[Annotated[str, Meta(min_length=8)]] = []
    # A key file: one `<id> <user|admin> sha256:<hex>` line per key (hashed at rest; `eie hash-key`).
    api_key_file: str | None = None
    # Who may read GET /metrics: open, key (any API key) or admin.
    metrics_auth: MetricsAuth = "open"
    # SIGTERM: how long in-flight requests may finish before they are cancelled.
    drain_grace_s: Annotated[float, Meta(ge=0, le=3600)] = 20.0
    # A streamed answer (SSE) with nothing to send for this long gets a comment line, so proxies
    # and clients with idle timeouts keep it open (0: never). The first one starts the response:
    # a failure after it is the stream's last event instead of an HTTP status.
    stream_keepalive_s: Annotated[float, Meta(ge=0, le=3600)] = 15.0
    # Log lines as JSON objects (one per line) or as plain text.
    log_format: LogFormat = "json"
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    responses: ResponsesConfig = field(default_factory=ResponsesConfig)
    files: FilesConfig = field(default_factory=FilesConfig)
    batches: BatchesConfig = field(default_factory=BatchesConfig)
    # Where the appliance keeps state that must survive (audit trail); default $EIE_STATE_DIR,
    # $STATE_DIRECTORY (systemd's StateDirectory) or ~/.local/state/eie.
    state_dir: str | None = None
    # Where it keeps what can be rebuilt (the KV disk tier); default $EIE_CACHE_DIR,
    # $CACHE_DIRECTORY (systemd's CacheDirectory) or ~/.cache/eie.
    cache_dir: str | None = None
    # Browser pages (their origins, as `https://chat.example`, or "*") that may call the APIs:
    # CORS headers and preflight answers for them (none: browsers refuse cross-origin calls).
    cors_origins: list[Annotated[str, Meta(min_length=1, max_length=512)]] = []


class AuditConfig(Struct, frozen=True, forbid_unknown_fields=True):
    """The hash-chained audit trail (off unless `path` is set)."""

    # The trail file; relative paths resolve against server.state_dir.
    path: str | None = None
    # Also record prompts and answers (off: only who, what, which models, outcome, token counts).
    include_content: bool = False
    # Rotate to <path>.1, <path>.2, ... past this size; the chain continues in the new file.
    max_mb: Annotated[int, Meta(ge=1, le=1_048_576)] = 64
    # Rotated files kept (the oldest beyond this are deleted).
    keep: Annotated[int, Meta(ge=1, le=10_000)] = 10


class PolicyConfig(Struct, frozen=True, forbid_unknown_fields=True):
    # generic | pinned-group | multi-group | fixed-appliance | plugin:<file.so> | plugin:<module>:<Class>
    strategy: Strategy = "fixed-appliance"
    # generic: an idle model is unloaded after this many seconds (0: only under memory pressure).
    keep_alive_s: Annotated[float, Meta(ge=0)] = 300.0
    # generic: how long a request waits for its model to load.
    load_timeout_s: Annotated[float, Meta(gt=0)] = 120.0
    # Options handed to a plugin's init as JSON.
    plugin_options: dict[str, Any] = {}
    # When set, `plugin:<file.so>` must lie inside this directory (relative to the config file).
    plugin_dir: str | None = None


class VramConfig(Struct, frozen=True, forbid_unknown_fields=True):
    """Memory QoS; applies to the GPU when present, to RAM on CPU-only devices."""

    reserve_mb: Annotated[int, Meta(ge=0)] = 512
    # The memory models may use; default: the device's total minus reserve_mb.
    budget_mb: Annotated[int, Meta(ge=1)] | None = None
    low_watermark: Annotated[float, Meta(gt=0, le=100)] = 85.0
    critical_watermark: Annotated[float, Meta(gt=0, le=100)] = 95.0
    group_isolation: bool = False


class Config(Struct, frozen=True, forbid_unknown_fields=True):
    models: Annotated[list[ModelConfig], Meta(min_length=1)]
    groups: list[GroupConfig] = []
    server: ServerConfig = field(default_factory=ServerConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    vram: VramConfig = field(default_factory=VramConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    audit: AuditConfig = field(default_factory=AuditConfig)
    # Relative model paths resolve against model_dir, itself relative to the config file.
    model_dir: str = "."
    # Where the config was read from; set by load_config, not by users.
    source_dir: str = "."

    def model_base(self) -> Path:
        """model_dir as an absolute path (relative ones resolve against the config file)."""
        base = Path(self.model_dir)
        if not base.is_absolute():
            base = Path(self.source_dir) / base
        return base.resolve()

    def state_dir(self) -> Path:
        """server.state_dir (relative to the config file), $EIE_STATE_DIR, $STATE_DIRECTORY, or
        ~/.local/state/eie."""
        return self._dir(self.server.state_dir, "EIE_STATE_DIR", "STATE_DIRECTORY",
                         Path.home() / ".local" / "state" / "eie")

    def cache_dir(self) -> Path:
        """server.cache_dir (relative to the config file), $EIE_CACHE_DIR, $CACHE_DIRECTORY, or
        ~/.cache/eie."""
        return self._dir(self.server.cache_dir, "EIE_CACHE_DIR", "CACHE_DIRECTORY",
                         Path.home() / ".cache" / "eie")

    def _dir(self, configured: str | None, own_env: str, systemd_env: str, default: Path) -> Path:
        # systemd joins several directories with ':'; EIE uses the first.
        raw = configured or os.environ.get(own_env) or os.environ.get(systemd_env, "").split(":")[0]
        if not raw:
            return default
        path = Path(raw)
        return (path if path.is_absolute() else Path(self.source_dir) / path).resolve()

    def responses_dir(self) -> Path | None:
        """Where stored Responses API responses are written, or None when they stay in memory."""
        return self.state_dir() / "responses" if self.server.responses.persist else None

    def conversations_dir(self) -> Path | None:
        """Where stored conversations (the Conversations API) are written, or None when they stay in memory."""
        return self.state_dir() / "conversations" if self.server.responses.persist else None

    def chat_completions_dir(self) -> Path | None:
        """Where stored chat completions (`store: true`) are written, or None when they stay in memory."""
        return self.state_dir() / "chat_completions" if self.server.responses.persist else None

    def files_dir(self) -> Path:
        """Where the Files API's files (and the batches' state) are kept."""
        return self.state_dir() / "files"

    def audit_path(self) -> Path | None:
        """The audit trail file (relative to the state directory), or None when auditing is off."""
        if not self.audit.path:
            return None
        path = Path(self.audit.path)
        return path if path.is_absolute() else self.state_dir() / path

    def key_file(self) -> Path | None:
        """server.api_key_file, relative to the config file."""
        if not self.server.api_key_file:
            return None
        path = Path(self.server.api_key_file)
        return path if path.is_absolute() else (Path(self.source_dir) / path).resolve()

    def kv_disk_dir(self, model: ModelConfig) -> Path | None:
        """The model's prefix-cache disk tier directory, or None when it is off."""
        disk = model.kv_cache.disk
        if not disk.enabled:
            return None
        if disk.path:
            path = Path(disk.path)
            return (path if path.is_absolute() else Path(self.source_dir) / path).resolve()
        return self.cache_dir() / "kv"

    def draft_path(self, model: ModelConfig) -> Path | None:
        """The GGUF of the model's draft_model (a configured model's file, or a path), or None."""
        name = model.speculative.draft_model
        if name is None:
            return None
        other = self.model(name)
        return self.model_path(other) if other is not None else self.model_path(ModelConfig(name="draft", path=name))

    def model_path(self, model: ModelConfig) -> Path:
        return self._under_model_dir(model.path)

    def _under_model_dir(self, file: str) -> Path:
        path = Path(file)
        return path if path.is_absolute() else (self.model_base() / path).resolve()

    def model(self, name: str) -> ModelConfig | None:
        for m in self.models:
            if m.name == name:
                return m
        return None

    def adapter(self, name: str) -> tuple[ModelConfig, int] | None:
        """The model a LoRA adapter name belongs to, with the adapter's index in its `lora` list."""
        for m in self.models:
            for i, a in enumerate(m.lora):
                if a.name == name:
                    return m, i
        return None

    def base_of(self, name: str) -> str:
        """The configured model that serves `name`: itself, or the model a LoRA adapter name belongs to."""
        found = self.adapter(name)
        return found[0].name if found is not None else name

    def adapter_path(self, adapter: LoraAdapterConfig | ControlVectorConfig) -> Path:
        return self._under_model_dir(adapter.path)

    def control_files(self, m: ModelConfig) -> list[tuple[Path, float]]:
        """A model's control vector files, resolved, with their scales."""
        return [(self.adapter_path(c), c.scale) for c in m.control_vectors]

    def group(self, name: str) -> GroupConfig | None:
        for g in self.groups:
            if g.name == name:
                return g
        return None


class ConfigError(Exception):
    """A configuration that cannot be used; `problems` holds one message per problem."""

    def __init__(self, problems: list[str], source: str = "config"):
        self.problems = problems
        self.source = source
        super().__init__(f"{source}: {len(problems)} problem(s):\n" + "\n".join(f"  {p}" for p in problems))


_USER_KEYS_HIDDEN = {"source_dir"}
_FRIENDLY_PATTERNS = {
    _STRATEGY_PATTERN: "one of generic, pinned-group, multi-group, fixed-appliance, plugin:<file.so>, "
    "plugin:<module>:<Class>",
    _SELECT_PATTERN: "one of consensus, logprob, first, judge:<model>",
}


def _describe(t: mi.Type) -> str:
    """A short human description of what a schema type accepts."""
    if isinstance(t, mi.IntType):
        return "int" + _bounds(t)
    if isinstance(t, mi.FloatType):
        return "number" + _bounds(t)
    if isinstance(t, mi.StrType):
        if t.pattern in _FRIENDLY_PATTERNS:
            return _FRIENDLY_PATTERNS[t.pattern]
        parts = []
        if t.min_length:
            parts.append(f"at least {t.min_length} character{'s' if t.min_length > 1 else ''}")
        if t.max_length is not None:
            parts.append(f"at most {t.max_length} characters")
        if t.pattern:
            parts.append(f"matching {t.pattern}")
        return "string" + (f" ({', '.join(parts)})" if parts else "")
    if isinstance(t, mi.BoolType):
        return "bool (true or false)"
    if isinstance(t, mi.LiteralType):
        return "one of " + ", ".join(str(v) for v in t.values)
    if isinstance(t, mi.ListType):
        return f"list of {_describe(t.item_type)}"
    if isinstance(t, mi.StructType):
        return "mapping with keys " + ", ".join(f.encode_name for f in t.fields if f.encode_name not in _USER_KEYS_HIDDEN)
    if isinstance(t, mi.DictType):
        return f"mapping of {_describe(t.key_type)} to {_describe(t.value_type)}"
    if isinstance(t, mi.UnionType):
        return " or ".join(_describe(a) for a in t.types)
    if isinstance(t, mi.NoneType):
        return "null"
    return type(t).__name__


def _bounds(t: mi.IntType | mi.FloatType) -> str:
    parts = []
    for attr, sym in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
        v = getattr(t, attr, None)
        if v is not None:  # msgspec gives a float bound as -16 or -16.0, depending on what it built before
            parts.append(f"{sym} {int(v) if isinstance(v, float) and v.is_integer() else v}")
    return (" " + " and ".join(parts)) if parts else ""


def _got(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _check(value: Any, t: mi.Type, path: str, problems: list[str]) -> None:
    """Validate `value` against `t`, appending one message per problem found."""
    if isinstance(t, mi.UnionType):
        non_null = [a for a in t.types if not isinstance(a, mi.NoneType)]
        if value is None and len(non_null) < len(t.types):
            return
        if len(non_null) == 1:
            _check(value, non_null[0], path, problems)
            return
        for alt in non_null:
            trial: list[str] = []
            _check(value, alt, path, trial)
            if not trial:
                return
        problems.append(f"{path}: expected {_describe(t)}, got {_got(value)}")
        return
    if isinstance(t, mi.StructType):
        if not isinstance(value, dict):
            problems.append(f"{path}: expected a mapping, got {_got(value)}")
            return
        known = {f.encode_name: f for f in t.fields if f.encode_name not in _USER_KEYS_HIDDEN}
        for key in value:
            if key not in known:
                allowed = ", ".join(sorted(known))
                problems.append(f"{_join(path, str(key))}: unknown key (allowed: {allowed})")
        for f in known.values():
            sub = _join(path, f.encode_name)
            if f.encode_name in value:
                _check(value[f.encode_name], f.type, sub, problems)
            elif f.required:
                problems.append(f"{sub}: required key is missing (expected {_describe(f.type)})")
        return
    if isinstance(t, mi.DictType):
        if not isinstance(value, dict):
            problems.append(f"{path}: expected {_describe(t)}, got {_got(value)}")
            return
        for key, item in value.items():
            _check(key, t.key_type, f"{path} key {_got(key)}", problems)
            _check(item, t.value_type, _join(path, str(key)), problems)
        return
    if isinstance(t, mi.ListType):
        if not isinstance(value, list):
            problems.append(f"{path}: expected {_describe(t)}, got {_got(value)}")
            return
        if t.min_length is not None and len(value) < t.min_length:
            problems.append(f"{path}: expected at least {t.min_length} item(s), got {len(value)}")
        if t.max_length is not None and len(value) > t.max_length:
            problems.append(f"{path}: expected at most {t.max_length} item(s), got {len(value)}")
        for i, item in enumerate(value):
            _check(item, t.item_type, f"{path}[{i}]", problems)
        return
    try:
        msgspec.convert(value, mi_to_python(t), strict=True)
    except msgspec.ValidationError:
        if isinstance(t, mi.FloatType) and isinstance(value, int) and not isinstance(value, bool):
            try:
                msgspec.convert(float(value), mi_to_python(t), strict=True)
                return
            except msgspec.ValidationError:
                pass
        problems.append(f"{path}: expected {_describe(t)}, got {_got(value)}")


def mi_to_python(t: mi.Type) -> Any:
    """Rebuild a Python annotation (with its Meta constraints) from an inspected scalar type."""
    if isinstance(t, mi.LiteralType):
        return Literal[t.values]  # type: ignore[valid-type]
    base: Any
    meta: dict[str, Any] = {}
    if isinstance(t, mi.IntType):
        base = int
        meta = {k: getattr(t, k) for k in ("ge", "gt", "le", "lt") if getattr(t, k) is not None}
    elif isinstance(t, mi.FloatType):
        base = float
        meta = {k: getattr(t, k) for k in ("ge", "gt", "le", "lt") if getattr(t, k) is not None}
    elif isinstance(t, mi.StrType):
        base = str
        meta = {k: getattr(t, k) for k in ("min_length", "max_length", "pattern") if getattr(t, k) is not None}
        if meta.get("min_length") == 0:
            meta.pop("min_length")
    elif isinstance(t, mi.BoolType):
        base = bool
    elif isinstance(t, mi.NoneType):
        return type(None)
    else:
        return Any
    return Annotated[base, Meta(**meta)] if meta else base


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _cross_checks(raw: dict[str, Any], problems: list[str]) -> None:
    models = raw.get("models")
    if not isinstance(models, list):
        return
    inherited = _inherited(raw, "kv_cache")
    seen: dict[str, int] = {}
    for i, m in enumerate(models):
        if not isinstance(m, dict):
            continue
        name = m.get("name")
        if isinstance(name, str):
            if name in seen:
                problems.append(f"models[{i}].name: duplicate model name {_got(name)} (also models[{seen[name]}])")
            else:
                seen[name] = i
        own = m.get("kv_cache") if isinstance(m.get("kv_cache"), dict) else {}
        mode = own.get("mode", inherited.get("mode", "f16"))
        if m.get("flash_attn") == "off" and mode in get_args(KvMode) and mode not in ("f32", "f16", "bf16"):
            what = "auto may choose a quantized V cache, which" if mode == "auto" else f"a quantized V cache ({mode})"
            if "mode" in own:
                problems.append(
                    f"models[{i}].kv_cache.mode: {what} needs flash attention; "
                    f"set models[{i}].flash_attn to auto or on, or use f16"
                )
            else:
                problems.append(
                    f"models[{i}].flash_attn: off, but inference.kv_cache.mode ({mode}) applies to this model and "
                    f"{'may choose a quantized V cache, which' if mode == 'auto' else 'quantizes V, which'} needs "
                    f"flash attention; set models[{i}].flash_attn to auto or on, or set models[{i}].kv_cache.mode: f16"
                )
        _spec_checks(f"models[{i}].speculative", _inherited(raw, "speculative"), _mapping(m.get("speculative")),
                     problems, name)
        if m.get("pooling", "auto") != "auto" and m.get("embedding") is not True:
            problems.append(f"models[{i}].pooling: {_got(m.get('pooling'))} pools an embedding model's token states; "
                            f"set models[{i}].embedding: true, or leave pooling out")
        _lora_checks(i, m, problems)
        n_batch, n_ctx, n_parallel = m.get("n_batch"), m.get("n_ctx", 4096), m.get("n_parallel", 4)
        # (each one's own type and range are checked apart: a bad one is named there, not here)
        if (all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in (n_batch, n_ctx, n_parallel))
                and n_batch > n_ctx * n_parallel):
            problems.append(f"models[{i}].n_batch: must not exceed n_ctx * n_parallel ({n_ctx * n_parallel})")
    served = _model_names(models) | _adapter_name_checks(models, problems)
    _group_checks(raw, served,
                  _model_names(models, lambda m: m.get("embedding") is True), problems)
    vram = raw.get("vram")
    if isinstance(vram, dict):
        low, critical = vram.get("low_watermark", 85.0), vram.get("critical_watermark", 95.0)
        if isinstance(low, (int, float)) and isinstance(critical, (int, float)) and low > critical:
            problems.append(f"vram.low_watermark: {low} must not exceed vram.critical_watermark ({critical})")
    policy = raw.get("policy")
    if isinstance(policy, dict) and policy.get("strategy") in ("pinned-group", "multi-group"):
        groups = raw.get("groups") if isinstance(raw.get("groups"), list) else []
        if not any(isinstance(g, dict) and g.get("pinned") for g in groups):
            problems.append(f"policy.strategy: {policy['strategy']} needs at least one group with pinned: true")
    server = raw.get("server")
    if isinstance(server, dict):
        keys = server.get("api_keys")
        if isinstance(keys, list) and len(set(map(str, keys))) != len(keys):
            problems.append("server.api_keys: duplicate keys")


def _lora_checks(i: int, m: dict[str, Any], problems: list[str]) -> None:
    if m.get("lora") and m.get("embedding") is True:
        problems.append(f"models[{i}].lora: an embedding model serves no adapters; leave lora out")
    if m.get("control_vectors") and m.get("embedding") is True:
        problems.append(f"models[{i}].control_vectors: an embedding model is not steered; leave control_vectors out")
    layers = m.get("control_vector_layers")
    if layers is not None and not m.get("control_vectors"):
        problems.append(f"models[{i}].control_vector_layers: bounds the layers control_vectors act on; "
                        "set control_vectors, or leave it out")
    elif isinstance(layers, list) and len(layers) == 2 and all(isinstance(x, int) for x in layers) and layers[0] > layers[1]:
        problems.append(f"models[{i}].control_vector_layers: the first layer ({layers[0]}) is after the last "
                        f"({layers[1]}); give [first, last]")


def _model_names(models: list[Any], which: Callable[[dict], bool] = lambda _m: True) -> set[str]:
    """The names of the models `which` picks, where they are strings (another type is reported
    where the model is checked, and would not go in a set)."""
    return {m["name"] for m in models if isinstance(m, dict) and isinstance(m.get("name"), str) and which(m)}


def _adapter_name_checks(models: list[Any], problems: list[str]) -> set[str]:
    """An adapter is asked by its name where a model's goes: the names of models and adapters
    differ. Returns the adapters' names."""
    model_names = _model_names(models)
    seen: dict[str, str] = {}
    for i, m in enumerate(models):
        adapters = m.get("lora") if isinstance(m, dict) else None
        for j, a in enumerate(adapters if isinstance(adapters, list) else []):
            name = a.get("name") if isinstance(a, dict) else None
            if not isinstance(name, str):
                continue
            at = f"models[{i}].lora[{j}].name"
            if name in model_names:
                problems.append(f"{at}: {_got(name)} is also a model's name; an adapter is asked by its name "
                                "where a model's goes, so the names must differ")
            elif name in seen:
                problems.append(f"{at}: duplicate adapter name {_got(name)} (also {seen[name]})")
            else:
                seen[name] = at
    return set(seen)


def _plugin_check(raw: dict[str, Any], source_dir: str, problems: list[str]) -> None:
    """A `plugin:<file>` strategy must resolve (links followed) inside policy.plugin_dir, when set."""
    policy = raw.get("policy")
    if not isinstance(policy, dict) or not isinstance(policy.get("plugin_dir"), str):
        return
    strategy = policy.get("strategy")
    if not isinstance(strategy, str) or not strategy.startswith("plugin:"):
        return
    target = strategy[len("plugin:"):]
    if ":" in target and "/" not in target:
        return  # module:Class, a Python plugin found on the import path
    base = Path(source_dir)
    plugin_dir = (base / policy["plugin_dir"]).resolve()
    lib = (base / target).resolve()
    if not lib.is_relative_to(plugin_dir):
        problems.append(f"policy.strategy: plugin library {target!r} is outside policy.plugin_dir ({plugin_dir})")


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _inherited(raw: dict[str, Any], section: str) -> dict[str, Any]:
    """The raw `inference.<section>` mapping every model starts from ({} when absent or malformed)."""
    inference = raw.get("inference")
    return _mapping(inference.get(section) if isinstance(inference, dict) else None)


def _with_inherited(raw: dict[str, Any]) -> dict[str, Any]:
    """Each model's kv_cache and speculative overlaid on inference's, key by key (a model's own key wins)."""
    models = raw["models"]
    for section in ("kv_cache", "speculative"):
        inherited = _inherited(raw, section)
        if inherited:
            models = [{**m, section: {**inherited, **m.get(section, {})}} for m in models]
    return {**raw, "models": models}


def _spec_checks(at: str, inherited: dict[str, Any], own: dict[str, Any], problems: list[str], model: Any) -> None:
    """Cross-field checks of one model's speculative settings (inherited keys included). A model
    named as the draft model in `inference.speculative` does not draft for itself (no error)."""
    spec = {**inherited, **own}
    sources = spec.get("sources") if isinstance(spec.get("sources"), list) else []
    if len(set(map(str, sources))) != len(sources):
        problems.append(f"{at}.sources: each source may appear once, got {_got(sources)}")
    if "draft_model" in sources and not spec.get("draft_model"):
        problems.append(f"{at}.draft_model: required when sources lists draft_model (a GGUF path or a configured "
                        "model with the target's vocabulary)")
    if isinstance(model, str) and own.get("draft_model") == model and "draft_model" in sources:
        problems.append(f"{at}.draft_model: a model cannot be its own draft model")
    lo, hi = spec.get("min_draft", 1), spec.get("max_draft", 16)
    if isinstance(lo, int) and isinstance(hi, int) and lo > hi:
        problems.append(f"{at}.min_draft: {lo} must not exceed max_draft ({hi})")


def _group_checks(raw: dict[str, Any], model_names: set[Any], embedders: set[Any], problems: list[str]) -> None:
    """`embedders`: the names of embedding models (models[].embedding), which do not generate."""
    groups = raw.get("groups")
    if not isinstance(groups, list):
        return
    known = ", ".join(sorted(str(n) for n in model_names if isinstance(n, str)))
    seen: dict[str, int] = {}
    for i, g in enumerate(groups):
        if not isinstance(g, dict):
            continue
        at = f"groups[{i}]"
        name = g.get("name")
        if isinstance(name, str):
            if name in seen:
                problems.append(f"{at}.name: duplicate group name {_got(name)} (also groups[{seen[name]}])")
            if name in model_names:
                problems.append(f"{at}.name: {_got(name)} is also a model's name; a group is asked by its name "
                                "where a model's goes (/v1/chat/completions), so the names must differ")
            seen.setdefault(name, i)
        members = g.get("models") if isinstance(g.get("models"), list) else []
        for j, m in enumerate(members):
            if isinstance(m, str) and m not in model_names:
                problems.append(f"{at}.models[{j}]: unknown model {_got(m)} (configured: {known})")
            elif isinstance(m, str) and m in embedders:
                problems.append(f"{at}.models[{j}]: {m!r} is an embedding model (models[].embedding), "
                                "which does not generate")
        gtype = g.get("type", "parallel")
        required = g.get("required_responses")
        if isinstance(required, int) and members and gtype != "sequential":
            total = len(members) * (g.get("samples", 1) if isinstance(g.get("samples"), int) else 1)
            if required > total:
                problems.append(f"{at}.required_responses: {required} is more than the group's {total} answers")
        fallback = g.get("fallback")
        if isinstance(fallback, dict) and isinstance(fallback.get("replace_with"), str):
            if fallback["replace_with"] not in model_names:
                problems.append(f"{at}.fallback.replace_with: unknown model {_got(fallback['replace_with'])} (configured: {known})")
            elif fallback["replace_with"] in embedders:
                problems.append(f"{at}.fallback.replace_with: {fallback['replace_with']!r} is an embedding model "
                                "(models[].embedding), which does not generate")
        select = g.get("select")
        if select is not None and gtype != "fanout":
            problems.append(f"{at}.select: only fanout groups select an answer (this group is {gtype})")
        if isinstance(select, str) and select.startswith("judge:") and select[6:] not in model_names:
            problems.append(f"{at}.select: judge model {_got(select[6:])} is not configured (configured: {known})")
        elif isinstance(select, str) and select.startswith("judge:") and select[6:] in embedders:
            problems.append(f"{at}.select: judge model {select[6:]!r} is an embedding model (models[].embedding), "
                            "which does not generate")
        if g.get("samples", 1) != 1 and gtype != "fanout":
            problems.append(f"{at}.samples: only fanout groups draw several samples (this group is {gtype})")
        templates = g.get("prompt_templates")
        if isinstance(templates, list) and templates:
            if gtype != "sequential":
                problems.append(f"{at}.prompt_templates: only sequential groups use prompt templates")
            elif len(templates) != len(members):
                problems.append(f"{at}.prompt_templates: expected one entry per member ({len(members)}), got {len(templates)}")
            for j, t in enumerate(templates):
                if isinstance(t, str) and "{input}" not in t:
                    problems.append(f"{at}.prompt_templates[{j}]: must contain {{input}} (where the previous output goes)")
        overrides = g.get("member_timeout_ms")
        if isinstance(overrides, dict):
            for m in overrides:
                if m not in members:
                    problems.append(f"{at}.member_timeout_ms.{m}: {_got(m)} is not a member of this group")
    _pool_checks(raw, groups, problems)


def _pool_checks(raw: dict[str, Any], groups: list[Any], problems: list[str]) -> None:
    """Under group isolation, the groups' memory pools: a model is charged to one pool, and the
    pools fit in vram.budget_mb where it is set."""
    vram, policy = _mapping(raw.get("vram")), _mapping(raw.get("policy"))
    if vram.get("group_isolation") is not True and policy.get("strategy") != "multi-group":
        return
    pooled: dict[str, int] = {}
    total = 0
    for i, g in enumerate(groups):
        budget = g.get("budget_mb") if isinstance(g, dict) else None
        if not isinstance(budget, (int, float)) or isinstance(budget, bool) or budget <= 0:
            continue
        total += budget
        for j, m in enumerate(g.get("models") if isinstance(g.get("models"), list) else []):
            if not isinstance(m, str):
                continue
            if m in pooled and pooled[m] != i:
                problems.append(f"groups[{i}].models[{j}]: {m!r} is in groups[{pooled[m]}]'s memory pool already "
                                "(budget_mb); a model is charged to one pool, so it may be in one group with a budget")
            pooled.setdefault(m, i)
    device = vram.get("budget_mb")
    if isinstance(device, (int, float)) and not isinstance(device, bool) and total > device:
        problems.append(f"groups: the groups' budget_mb add up to {total:g} MiB, more than vram.budget_mb ({device:g}); "
                        "the pools share the device's budget")


_SCHEMA = mi.type_info(Config)


def parse_config(raw: Any, source: str = "config", source_dir: str = ".") -> Config:
    """Validate a decoded YAML document and build the Config, or raise ConfigError."""
    problems: list[str] = []
    if not isinstance(raw, dict):
        raise ConfigError([f"(top level): expected a mapping, got {_got(raw)}"], source)
    _check(raw, _SCHEMA, "", problems)
    _cross_checks(raw, problems)
    _plugin_check(raw, source_dir, problems)
    if problems:
        raise ConfigError(problems, source)
    try:
        return msgspec.convert({**_with_inherited(raw), "source_dir": source_dir}, Config, strict=False)
    except msgspec.ValidationError as e:  # the walker should have caught it; never let it pass silently
        raise ConfigError([str(e)], source) from e


class _StrictLoader(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last: a
    repeated `server:` section dropped the first without a word)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (also on line {seen[key]})", key_node.start_mark)
                seen[key] = line
            except TypeError:  # an unhashable key: the constructor says so below
                pass
        return super().construct_mapping(node, deep)


def load_config(path: str | Path) -> Config:
    """Read and validate a YAML config file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError([f"cannot read config file: {e.strerror or e}"], str(p)) from e
    try:
        raw = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as e:
        raise ConfigError([f"invalid YAML: {e}"], str(p)) from e
    return parse_config(raw, str(p), str(p.resolve().parent))

