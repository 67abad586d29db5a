"""A tiny BERT embedding model written with the `gguf` package: random weights, a small WordPiece
vocabulary, the layout llama.cpp's `bert` architecture reads (what convert_hf_to_gguf.py writes
for bge, MiniLM and other sentence encoders). No BERT GGUF ships on PyPI, so the encoder-only
path is tested with this one: its vectors mean nothing, but llama.cpp computes them for real.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

SPECIALS = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]"}
WORDS = ("the a an of to in on at is was it and or but for with as by this that cat dog sat mat "
         "quarterly revenue grew five percent hi much longer sentence about weather oslo during dark "
         "winter months year model server memory cache token hello world").split()


def vocabulary() -> list[str]:
    """Specials at BERT's ids, then word-start pieces ("▁word", as the converter writes "word")
    and continuation pieces ("x", as it writes "##x") for every letter and digit."""
    tokens = [SPECIALS.get(i, f"[unused{i}]") for i in range(104)]
    chars = "abcdefghijklmnopqrstuvwxyz0123456789"
    pieces = ["\u2581" + w for w in (*WORDS, *chars, *".,!?;:'\"-()")] + list(chars)
    return tokens + list(dict.fromkeys(pieces))  # a word that is also a letter ("a") once


def write_tiny_bert(path: Path, *, n_embd: int = 64, n_head: int = 4, n_ff: int = 128, n_layer: int = 2,
                    n_ctx_train: int = 128, pooling: int = 1, seed: int = 0) -> Path:
    """Write the model to `path`; `pooling` is the GGUF's pooling type (1 mean, 2 cls)."""
    rng = np.random.default_rng(seed)
    tokens = vocabulary()
    w = gguf.GGUFWriter(str(path), "bert")
    w.add_name("tiny-bert (random weights, EIE tests)")
    w.add_context_length(n_ctx_train)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_block_count(n_layer)
    w.add_head_count(n_head)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType(pooling))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("bert")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t.startswith("[") else gguf.TokenType.NORMAL for t in tokens])
    w.add_token_type_count(2)
    w.add_bos_token_id(101)
    w.add_sep_token_id(102)
    w.add_unk_token_id(100)
    w.add_pad_token_id(0)
    w.add_mask_token_id(103)

    def tensor(name: str, *shape: int, scale: float = 0.05) -> None:
        w.add_tensor(name, (rng.standard_normal(shape) * scale).astype(np.float32))

    def norm(name: str) -> None:
        w.add_tensor(f"{name}.weight", (1 + rng.standard_normal(n_embd) * 0.05).astype(np.float32))
        w.add_tensor(f"{name}.bias", (rng.standard_normal(n_embd) * 0.05).astype(np.float32))

    # numpy shapes are ggml's reversed: (rows, columns) = (ne[1], ne[0])
    tensor("token_embd.weight", len(tokens), n_embd, scale=1.0)
    tensor("token_types.weight", 2, n_embd, scale=0.1)
    tensor("position_embd.weight", n_ctx_train, n_embd, scale=0.1)
    norm("token_embd_norm")
    for i in range(n_layer):
        for part, rows, cols in (("attn_q", n_embd, n_embd), ("attn_k", n_embd, n_embd),
                                 ("attn_v", n_embd, n_embd), ("attn_output", n_embd, n_embd),
                                 ("ffn_up", n_ff, n_embd), ("ffn_down", n_embd, n_ff)):
            tensor(f"blk.{i}.{part}.weight", rows, cols, scale=cols ** -0.5)
            tensor(f"blk.{i}.{part}.bias", rows, scale=0.02)
        norm(f"blk.{i}.attn_output_norm")
        norm(f"blk.{i}.layer_output_norm")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
