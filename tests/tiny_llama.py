"""A tiny random-weight llama GGUF (64 wide, 2 layers, a 300-token SentencePiece vocabulary), with
knobs for the malformations llama.cpp aborts the process on (tests/integration/test_faults.py,
tests/unit/engine/test_gguf_trial.py). Written with the `gguf` package, f32 weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np

WORDS = "the a of to in is was it and or cat dog sat mat hello world".split()


def vocabulary(n_vocab: int = 300) -> list[str]:
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *("\u2581" + w for w in WORDS)]
    tokens += [f"\u2581w{i}" for i in range(len(tokens), n_vocab)]
    return tokens[:n_vocab]


def write_tiny_llama(path: Path, *, n_embd: int = 64, n_layer: int = 2, n_head: int = 4, n_head_kv: int = 2,
                     n_ff: int = 128, block_count: int | None = None, eps: float = 1e-5,
                     tensor_types: dict[str, Any] | None = None, seed: int = 0,
                     deltas: dict[str, np.ndarray] | None = None) -> Path:
    """`block_count` is what the metadata says (the tensors have `n_layer` blocks); `tensor_types`
    stores the named tensors in another ggml type (quantized from the f32 values, or ints);
    `deltas` are added to the named tensors' values (a LoRA merged into the weights)."""
    rng = np.random.default_rng(seed)
    head = n_embd // n_head
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama (random weights)")
    w.add_context_length(512)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_block_count(n_layer if block_count is None else block_count)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_dimension_count(head)
    w.add_layer_norm_rms_eps(eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    tokens = vocabulary()
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in ("<s>", "</s>") else gguf.TokenType.UNKNOWN if t == "<unk>"
                       else gguf.TokenType.BYTE if t.startswith("<0x") else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_scores([-float(i) for i in range(len(tokens))])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    shapes = {"token_embd.weight": (len(tokens), n_embd), "output_norm.weight": (n_embd,),
              "output.weight": (len(tokens), n_embd)}
    for i in range(n_layer):
        shapes.update({f"blk.{i}.attn_norm.weight": (n_embd,), f"blk.{i}.attn_q.weight": (n_embd, n_embd),
                       f"blk.{i}.attn_k.weight": (head * n_head_kv, n_embd),
                       f"blk.{i}.attn_v.weight": (head * n_head_kv, n_embd),
                       f"blk.{i}.attn_output.weight": (n_embd, n_embd), f"blk.{i}.ffn_norm.weight": (n_embd,),
                       f"blk.{i}.ffn_gate.weight": (n_ff, n_embd), f"blk.{i}.ffn_up.weight": (n_ff, n_embd),
                       f"blk.{i}.ffn_down.weight": (n_embd, n_ff)})
    for name, shape in shapes.items():
        values = (1 + 0.01 * rng.standard_normal(shape) if len(shape) == 1
                  else rng.standard_normal(shape) * shape[-1] ** -0.5).astype(np.float32)
        if deltas and name in deltas:
            values = (values.astype(np.float64) + deltas[name]).astype(np.float32)
        kind = (tensor_types or {}).get(name)
        if kind is None:
            w.add_tensor(name, values)
        elif kind in (gguf.GGMLQuantizationType.I32, gguf.GGMLQuantizationType.F64):
            dtype = np.int32 if kind == gguf.GGMLQuantizationType.I32 else np.float64
            w.add_tensor(name, values.astype(dtype), raw_dtype=kind)
        else:
            w.add_tensor(name, gguf.quants.quantize(values, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
