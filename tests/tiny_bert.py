"""A tiny BERT written with the `gguf` package: random weights, a small WordPiece vocabulary, the
layout llama.cpp's `bert` architecture reads (what convert_hf_to_gguf.py writes for bge, MiniLM
and other sentence encoders), and with `head` a cross-encoder's classification head (a reranker,
pooling type rank). No BERT GGUF ships on PyPI, so the encoder path is tested with this one: its
vectors mean nothing, but llama.cpp computes them for real, and `forward` computes them again in
numpy from the file's tensors, as BERT defines them, for the tests to compare.
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
                    n_ctx_train: int = 128, pooling: int = 1, head: bool = False, rerank_template: str | None = None,
                    seed: int = 0) -> Path:
    """Write the model to `path`; `pooling` is the GGUF's pooling type (1 mean, 2 cls, 4 rank),
    `head` adds a classification head with one output (a reranker's score), `rerank_template` a
    rerank prompt (`tokenizer.chat_template.rerank`, with `{query}` and `{document}`)."""
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
    if rerank_template is not None:
        w.add_chat_template([{"name": "rerank", "template": rerank_template}])

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
    if head:
        tensor("cls.weight", n_embd, n_embd, scale=n_embd ** -0.5)
        tensor("cls.bias", n_embd, scale=0.02)
        tensor("cls.output.weight", 1, n_embd, scale=1.0)
        tensor("cls.output.bias", 1, scale=0.1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    mu = x.mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=-1, keepdims=True) + eps) * w + b


def _gelu(x: np.ndarray) -> np.ndarray:  # the tanh form, which ggml computes
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))


def forward(path: Path, tokens: list[int], pooling: str) -> np.ndarray:
    """BERT on one input in float64 from the GGUF's tensors: post-norm layers, bidirectional
    attention, token type 0 (as llama.cpp). `pooling`: mean, cls, last, or rank (the head's
    output on the first token's state)."""
    reader = gguf.GGUFReader(str(path))
    t = {x.name: np.asarray(x.data, dtype=np.float64) for x in reader.tensors}
    n_head = int(reader.fields["bert.attention.head_count"].contents())
    n_layer = int(reader.fields["bert.block_count"].contents())
    x = t["token_embd.weight"][tokens] + t["token_types.weight"][0] + t["position_embd.weight"][: len(tokens)]
    x = _layer_norm(x, t["token_embd_norm.weight"], t["token_embd_norm.bias"])
    n, d = x.shape
    hd = d // n_head

    def linear(name: str, v: np.ndarray) -> np.ndarray:
        return v @ t[f"{name}.weight"].T + t[f"{name}.bias"]

    for i in range(n_layer):
        q, k, v = (linear(f"blk.{i}.attn_{p}", x).reshape(n, n_head, hd).transpose(1, 0, 2) for p in "qkv")
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(hd)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        a = (probs @ v).transpose(1, 0, 2).reshape(n, d)
        x = _layer_norm(linear(f"blk.{i}.attn_output", a) + x, t[f"blk.{i}.attn_output_norm.weight"],
                        t[f"blk.{i}.attn_output_norm.bias"])
        f = linear(f"blk.{i}.ffn_down", _gelu(linear(f"blk.{i}.ffn_up", x)))
        x = _layer_norm(f + x, t[f"blk.{i}.layer_output_norm.weight"], t[f"blk.{i}.layer_output_norm.bias"])
    if pooling == "mean":
        return x.mean(axis=0)
    if pooling == "last":
        return x[-1]
    if pooling == "cls":
        return x[0]
    return linear("cls.output", np.tanh(linear("cls", x[0])))
