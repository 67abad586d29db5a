"""Random-weight LoRA adapters (GGUF, general.type adapter) for a base GGUF, written with the
`gguf` package as llama.cpp's convert_lora_to_gguf.py lays them out: for a weight W of
ggml shape [n_in, n_out], `<W>.lora_a` [n_in, rank] and `<W>.lora_b` [rank, n_out], in f16
(convert_lora_to_gguf.py's default) or f32."""

from __future__ import annotations

import functools
from pathlib import Path

import gguf
import numpy as np


@functools.cache
def base_layout(base: Path) -> tuple[str, tuple[tuple[str, tuple[int, ...]], ...]]:
    """The base's architecture and its tensors' names and ggml shapes, read once per run: gguf's
    reader takes 3 s on SmolLM2 and 17 s on Gemma 3 (their vocabularies' fields)."""
    reader = gguf.GGUFReader(str(base))
    arch = str(reader.fields["general.architecture"].contents())
    return arch, tuple((t.name, tuple(int(n) for n in t.shape)) for t in reader.tensors)


def lora_pairs(base: Path, targets: tuple[str, ...], rank: int, seed: int,
               strength: float) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """name -> (A, B) in numpy order (A: rank x n_in, B: n_out x rank) for every 2-D tensor of
    `base` whose name has a target (e.g. 'attn_q'); B @ A has a spectral size near `strength`
    times the weight's typical scale."""
    rng = np.random.default_rng(seed)
    pairs = {}
    for name, shape in base_layout(base)[1]:
        if len(shape) != 2 or not any(f".{target}." in name for target in targets):
            continue
        n_in, n_out = shape
        a = rng.standard_normal((rank, n_in)) * n_in ** -0.5
        b = rng.standard_normal((n_out, rank)) * strength * rank ** -0.5
        pairs[name] = (a.astype(np.float32), b.astype(np.float32))
    return pairs


def write_lora(base: Path, out: Path, *, targets: tuple[str, ...] = ("attn_q", "attn_v", "ffn_up"),
               rank: int = 8, alpha: float = 8.0, seed: int = 1, strength: float = 0.5,
               architecture: str | None = None, dtype: type = np.float16,
               invocation_tokens: list[int] | None = None) -> dict[str, np.ndarray]:
    """Write the adapter (an activated LoRA with `invocation_tokens`); returns each target's weight change at scale 1 (alpha / rank * B @ A),
    in numpy order, for merging it into a copy of the base (tests/tiny_llama.py's `deltas`)."""
    arch = architecture or base_layout(base)[0]
    pairs = {name: (a.astype(dtype), b.astype(dtype))
             for name, (a, b) in lora_pairs(base, targets, rank, seed, strength).items()}
    w = gguf.GGUFWriter(str(out), arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    if invocation_tokens is not None:
        w.add_key_value(gguf.Keys.Adapter.ALORA_INVOCATION_TOKENS, list(invocation_tokens), gguf.GGUFValueType.ARRAY,
                        sub_type=gguf.GGUFValueType.UINT32)
    for name, (a, b) in pairs.items():
        w.add_tensor(f"{name}.lora_a", a)
        w.add_tensor(f"{name}.lora_b", b)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return {name: (alpha / rank) * (b.astype(np.float64) @ a.astype(np.float64)) for name, (a, b) in pairs.items()}
