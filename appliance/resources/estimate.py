"""Memory a model will take, estimated from its GGUF metadata before anything is allocated.

Checked against llama.cpp's own buffer sizes after the load (`/v1/admin/vram/status` shows both).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gguf

from ..config import ModelConfig

# Bytes per value of each KV cache type (block size over bytes per block for quantized types).
KV_BYTES_PER_VALUE = {
    "f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
    "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32,
}


@dataclass(frozen=True)
class Estimate:
    weights: int
    kv: int
    compute: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute


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


def read_shape(path: Path) -> GgufShape:
    """Model dimensions from the GGUF header (via the `gguf` package); raises ValueError if unreadable."""
    try:
        reader = gguf.GGUFReader(str(path))
    except Exception as e:  # gguf raises assorted errors on corrupt files
        raise ValueError(f"not a readable GGUF file: {e}") from e

    def field(key: str, default=None):
        f = reader.fields.get(key)
        return f.contents() if f is not None else default

    arch = field("general.architecture")
    if not arch:
        raise ValueError("GGUF has no general.architecture")
    n_embd = int(field(f"{arch}.embedding_length", 0))
    n_head = int(field(f"{arch}.attention.head_count", 1) or 1)
    n_head_kv = field(f"{arch}.attention.head_count_kv", n_head)
    head_dim = n_embd // n_head if n_head else 0
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    n_vocab = int(field(f"{arch}.vocab_size", 0) or (len(tokens.data) if tokens is not None else 0))
    return GgufShape(
        architecture=arch,
        n_layer=int(field(f"{arch}.block_count", 0)),
        n_embd=n_embd,
        n_ff=int(field(f"{arch}.feed_forward_length", 0) or 0),
        n_head=n_head,
        n_head_kv=int(n_head_kv if not isinstance(n_head_kv, list) else max(n_head_kv)),
        key_length=int(field(f"{arch}.attention.key_length", head_dim)),
        value_length=int(field(f"{arch}.attention.value_length", head_dim)),
        n_vocab=n_vocab,
        tensor_bytes=int(sum(int(t.n_bytes) for t in reader.tensors)),
    )


def estimate(shape: GgufShape, cfg: ModelConfig) -> Estimate:
    cells = cfg.n_ctx * cfg.n_parallel
    per_cell = shape.n_layer * shape.n_head_kv * (
        shape.key_length * KV_BYTES_PER_VALUE[cfg.kv_cache.type_k]
        + shape.value_length * KV_BYTES_PER_VALUE[cfg.kv_cache.type_v]
    )
    n_batch = max(cfg.n_batch, cfg.n_parallel)
    # The compute buffer is dominated by the logits of a full ubatch; activations add a little.
    logits = n_batch * shape.n_vocab * 4
    activations = n_batch * (8 * shape.n_embd + 3 * shape.n_ff) * 4
    outputs = cfg.n_parallel * shape.n_vocab * 4
    return Estimate(weights=shape.tensor_bytes, kv=int(cells * per_cell), compute=logits + activations + outputs)
