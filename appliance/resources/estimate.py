"""Memory a model will take, estimated from its GGUF metadata before anything is allocated.

The metadata comes from llama.cpp's vocab-only load (engine/native.read_header).

Checked against llama.cpp's own buffer sizes after the load (`/v1/admin/vram/status` shows both).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelConfig
from .architectures import is_encoder
from .outputs import batch_cap, kv_cells, max_outputs
from .repack import repacked_output_bytes

# Bytes per value of each KV cache type (block size over bytes per block for quantized types).
KV_BYTES_PER_VALUE = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
    "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32,
    # TurboQuant blocks of 64 values (native/turboquant).
    "turbo4": 35 / 64, "turbo3": 28 / 64, "turbo2": 20 / 64,
}


@dataclass(frozen=True)
class Estimate:
    weights: int
    kv: int
    compute: int
    draft_model: int = 0  # a speculative draft model's weights, KV and compute (its own context)
    lora_adapters: int = 0  # the model's LoRA adapters' tensors (their files' size)

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute + self.draft_model + self.lora_adapters


@dataclass(frozen=True)
class GgufShape:
    architecture: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    key_length: int
    value_length: int
    n_vocab: int
    tensor_bytes: int
    # The output layer reads the token embeddings again (the GGUF has no output.weight): their
    # type and bytes, "" and 0 otherwise (resources/repack.py).
    tied_output_type: str = ""
    tied_output_bytes: int = 0
    # Bytes of each repeating layer's tensors, and of what the output layer puts on a GPU
    # (resources/offload.py); () and 0 when the tensor table was not read.
    block_bytes: tuple[int, ...] = ()
    output_bytes: int = 0


def shape_from_header(meta: dict[str, str], file_size: int) -> GgufShape:
    """Model dimensions from GGUF metadata (as llama.cpp reports it); raises ValueError if incomplete."""
    arch = meta.get("general.architecture")
    if not arch:
        raise ValueError("GGUF has no general.architecture")

    def num(key: str, default: int) -> int:
        value = meta.get(f"{arch}.{key}")
        if value is None:
            return default
        try:
            return int(float(value))
        except ValueError:  # per-layer arrays: take the largest entry
            parts = [int(float(x)) for x in value.strip("[]").split(",") if x.strip()]
            return max(parts) if parts else default

    n_embd = num("embedding_length", 0)
    n_head = num("attention.head_count", 1) or 1
    head_dim = n_embd // n_head
    return GgufShape(
        architecture=arch,
        n_layer=num("block_count", 0),
        n_embd=n_embd,
        n_ff=num("feed_forward_length", 0),
        n_head=n_head,
        n_head_kv=num("attention.head_count_kv", n_head),
        key_length=num("attention.key_length", head_dim),
        value_length=num("attention.value_length", head_dim),
        n_vocab=int(meta.get("n_vocab", 0)),
        # The tensor data is the file less its header; llama.cpp's buffers come within a few percent.
        tensor_bytes=file_size,
    )


def kv_bytes(shape: GgufShape, cells: int, type_k: str, type_v: str) -> int:
    """Bytes of a KV cache holding `cells` tokens with these K and V types (none for an encoder)."""
    if is_encoder(shape.architecture):
        return 0
    per_cell = shape.n_layer * shape.n_head_kv * (
        shape.key_length * KV_BYTES_PER_VALUE[type_k] + shape.value_length * KV_BYTES_PER_VALUE[type_v]
    )
    return int(cells * per_cell)


def estimate(shape: GgufShape, cfg: ModelConfig, type_k: str | None = None, type_v: str | None = None,
             n_outputs: int | None = None) -> Estimate:
    """What loading `cfg` takes; `type_k`/`type_v` replace the configured KV types (needed for mode
    auto); `n_outputs`: the logits rows of one decode (default: what the runner asks for)."""
    kv = kv_bytes(shape, kv_cells(cfg), type_k or cfg.kv_cache.type_k, type_v or cfg.kv_cache.type_v)
    n_batch = batch_cap(cfg)
    # The compute buffer holds the logits of the most rows one decode asks for (resources/outputs.py),
    # and the activations of a full ubatch.
    logits = (max_outputs(cfg) if n_outputs is None else n_outputs) * shape.n_vocab * 4
    activations = n_batch * (8 * shape.n_embd + 3 * shape.n_ff) * 4
    if cfg.flash_attn == "off":
        # llama.cpp then materialises the attention scores: float32, one row per KV cell a
        # sequence attends to (an embedding model's context holds one decode), per token and head.
        # SmolLM2 at n_ctx 4096, n_batch 512: 72 MiB of its 87 MiB compute buffer.
        n_kv = kv_cells(cfg) if cfg.embedding else cfg.n_ctx
        activations += n_kv * n_batch * shape.n_head * 4
    outputs = cfg.n_parallel * shape.n_vocab * 4
    if cfg.embedding:  # patch 0017: a pooling context has no output layer; its outputs are token states
        logits, outputs = 0, n_batch * shape.n_embd * 4
    return Estimate(weights=shape.tensor_bytes + repacked_output_bytes(shape), kv=kv,
                    compute=logits + activations + outputs)


def draft_estimate(shape: GgufShape, cfg: ModelConfig) -> int:
    """What the draft model of `cfg` takes: its context holds the target's sequences (n_ctx ×
    n_parallel cells, f16 KV) with the target's batch size and one logits row per sequence
    (engine/speculative/draft_model.py)."""
    return estimate(shape, cfg, "f16", "f16", n_outputs=cfg.n_parallel).total
