"""TurboQuant-MSE reference codec (numpy): the definition the C code must match bit for bit.

Layout of one block of BLOCK (64) values, `2 + BLOCK*bits/8` bytes:
  - the block's L2 norm as an IEEE fp16, little-endian (computed as float32(sqrt(sum of squares
    accumulated in float64, in order)), then rounded to fp16, saturated at 65504);
  - BLOCK indices of `bits` bits each, packed LSB-first into a little-endian bit stream.
A value is quantized as y = x · (8 / norm) in float32 (8 = √BLOCK, so y has unit variance for
a rotated block) and coded as the number of codebook thresholds strictly below y; it decodes as
centroid[index] · (norm / 8).

Bits per value: turbo4 4.25, turbo3 3.25, turbo2 2.25 (0.266, 0.203, 0.141 of f16).
The rotation (a randomised Walsh–Hadamard transform of each head vector) is applied before the
codec: llama.cpp's attention rotation in the graph, or `rotate` here for data at rest.
"""

from __future__ import annotations

import numpy as np

from .codebooks import BLOCK, MODES, lloyd_max

FP16_MAX = np.float32(65504.0)


def block_bytes(bits: int) -> int:
    return 2 + BLOCK * bits // 8


def row_bytes(bits: int, n: int) -> int:
    if n % BLOCK:
        raise ValueError(f"row length {n} is not a multiple of {BLOCK}")
    return n // BLOCK * block_bytes(bits)


def bits_per_value(bits: int) -> float:
    return block_bytes(bits) * 8 / BLOCK


def _norms(blocks: np.ndarray) -> np.ndarray:
    """fp16 norms of float32 blocks [n_blocks, BLOCK], accumulated in float64 in index order."""
    squares = blocks.astype(np.float64) ** 2
    ss = np.cumsum(squares, axis=1)[:, -1]
    norm32 = np.sqrt(ss).astype(np.float32)
    return np.minimum(norm32, FP16_MAX).astype(np.float16)


def _pack(idx: np.ndarray, bits: int) -> np.ndarray:
    """[n_blocks, BLOCK] indices → [n_blocks, BLOCK*bits/8] bytes, LSB-first bit stream."""
    shifts = np.arange(bits, dtype=np.uint8)
    bitplanes = ((idx[..., None] >> shifts) & 1).astype(np.uint8)  # [n, BLOCK, bits]
    stream = bitplanes.reshape(idx.shape[0], BLOCK * bits)
    return np.packbits(stream, axis=1, bitorder="little")


def _unpack(packed: np.ndarray, bits: int) -> np.ndarray:
    stream = np.unpackbits(packed, axis=1, bitorder="little").reshape(packed.shape[0], BLOCK, bits)
    weights = (1 << np.arange(bits)).astype(np.int64)
    return (stream.astype(np.int64) * weights).sum(axis=2)


def quantize(x: np.ndarray, mode: str) -> bytes:
    """Quantize float32 values (length a multiple of 64) to TurboQuant blocks."""
    bits = MODES[mode]
    cb = lloyd_max(bits)
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if x.size % BLOCK:
        raise ValueError(f"length {x.size} is not a multiple of {BLOCK}")
    blocks = x.reshape(-1, BLOCK)
    norms = _norms(blocks)
    n32 = norms.astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(n32 > 0, np.float32(8.0) / n32, np.float32(0.0)).astype(np.float32)
    y = (blocks * inv[:, None]).astype(np.float32)
    idx = np.searchsorted(cb.thresholds, y, side="left")
    out = np.empty((blocks.shape[0], block_bytes(bits)), dtype=np.uint8)
    out[:, :2] = norms.astype("<f2").view(np.uint8).reshape(-1, 2)
    out[:, 2:] = _pack(idx, bits)
    return out.tobytes()


def dequantize(data: bytes, mode: str) -> np.ndarray:
    bits = MODES[mode]
    cb = lloyd_max(bits)
    raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, block_bytes(bits))
    norms = raw[:, :2].copy().view("<f2").reshape(-1).astype(np.float32)
    idx = _unpack(raw[:, 2:], bits)
    scale = (norms * np.float32(0.125)).astype(np.float32)
    return (cb.centroids[idx] * scale[:, None]).astype(np.float32).reshape(-1)


def rotate(x: np.ndarray, head_dim: int, seed: int = 0) -> np.ndarray:
    """Randomised Walsh–Hadamard rotation of each head vector (head_dim a power of two)."""
    if head_dim & (head_dim - 1):
        raise ValueError("head_dim must be a power of two")
    rng = np.random.default_rng(seed)
    signs = rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=head_dim)
    v = np.asarray(x, dtype=np.float32).reshape(-1, head_dim) * signs
    h = 1
    while h < head_dim:
        v = v.reshape(-1, head_dim // (2 * h), 2, h)
        a, b = v[:, :, 0, :].copy(), v[:, :, 1, :].copy()
        v[:, :, 0, :], v[:, :, 1, :] = a + b, a - b
        v = v.reshape(-1, head_dim)
        h *= 2
    return (v / np.float32(np.sqrt(head_dim))).reshape(np.shape(x))
