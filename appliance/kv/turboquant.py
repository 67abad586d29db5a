"""TurboQuant-MSE reference codec (numpy): the definition the C code must match bit for bit.

One block holds BLOCK (64) values of a rotated head vector:
  - bytes 0-1: the block's L2 norm as IEEE fp16, little-endian (float32(sqrt(sum of squares
    accumulated in float64, in order)), rounded to fp16, saturated at 65504);
  - then one 4-bit gain code per sub-block (SUB_BLOCK values: 32 for turbo4, 16 for turbo3 and
    turbo2), two per byte, low nibble first;
  - then the 64 codebook indices, laid out for SIMD unpacking:
      4 bits: 32 bytes, byte j = idx[j] | idx[j+32] << 4;
      2 bits: 16 bytes, byte j = idx[j] | idx[j+16] << 2 | idx[j+32] << 4 | idx[j+48] << 6;
      3 bits: the low two bits as the 2-bit layout (16 bytes), then 8 bytes of high bits,
              bit k of byte j = the high bit of idx[j+8k].
Sub-block s has the scale `(norm · 0.125) · GAINS[code]` (float32 products; 0.125 = 1/√64, so
a rotated block has unit-variance coordinates at gain 1). Its values are quantized with each of
the 16 scales: y = x · (1/scale) in float32, coded as the number of codebook thresholds strictly
below y; the code with the least squared error (float64, summed in order; the lowest code on a
tie) is kept. A value decodes as centroid[index] · scale.

Bits per value: turbo4 4.375, turbo3 3.5, turbo2 2.5 (0.273, 0.219, 0.156 of f16).
The rotation (a Walsh–Hadamard transform of each head vector) is applied before the codec:
llama.cpp's attention rotation in the graph, or `rotate` here for data at rest.
"""

from __future__ import annotations

import numpy as np

from .codebooks import BLOCK, GAINS, MODES, SUB_BLOCK, lloyd_max

FP16_MAX = np.float32(65504.0)


def n_sub(bits: int) -> int:
    return BLOCK // SUB_BLOCK[bits]


def block_bytes(bits: int) -> int:
    return 2 + (n_sub(bits) + 1) // 2 + BLOCK * bits // 8


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


def _pack_indices(idx: np.ndarray, bits: int) -> np.ndarray:
    """[n, 64] indices → [n, 8·bits] bytes in the layout above."""
    idx = idx.astype(np.uint8)
    if bits == 4:
        return idx[:, :32] | (idx[:, 32:] << 4)
    low = idx & 3
    planes = low[:, :16] | (low[:, 16:32] << 2) | (low[:, 32:48] << 4) | (low[:, 48:] << 6)
    if bits == 2:
        return planes
    high = (idx >> 2) & 1  # [n, 64]: value j+8k → bit k of byte j
    high_bytes = np.zeros((idx.shape[0], 8), dtype=np.uint8)
    for k in range(8):
        high_bytes |= high[:, 8 * k : 8 * k + 8] << k
    return np.concatenate([planes, high_bytes], axis=1)


def _unpack_indices(raw: np.ndarray, bits: int) -> np.ndarray:
    if bits == 4:
        return np.concatenate([raw & 15, raw >> 4], axis=1).astype(np.int64)
    planes = raw[:, :16]
    low = np.concatenate([(planes >> (2 * k)) & 3 for k in range(4)], axis=1).astype(np.int64)
    if bits == 2:
        return low
    high = np.concatenate([(raw[:, 16:24] >> k) & 1 for k in range(8)], axis=1).astype(np.int64)
    return low | (high << 2)


def _scales(norms: np.ndarray) -> np.ndarray:
    """float32 [n_blocks, 16]: the scale of each gain code for each block."""
    base = (norms.astype(np.float32) * np.float32(0.125)).astype(np.float32)
    return (base[:, None] * GAINS[None, :]).astype(np.float32)


def quantize(x: np.ndarray, mode: str) -> bytes:
    """Quantize float32 values (length a multiple of 64) to TurboQuant blocks."""
    bits = MODES[mode]
    cb = lloyd_max(bits)
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if x.size % BLOCK:
        raise ValueError(f"length {x.size} is not a multiple of {BLOCK}")
    blocks = x.reshape(-1, BLOCK)
    n, ns, sub = blocks.shape[0], n_sub(bits), SUB_BLOCK[bits]
    norms = _norms(blocks)
    scales = _scales(norms)  # [n, 16]
    with np.errstate(divide="ignore"):
        inv = np.where(scales > 0, np.float32(1.0) / scales, np.float32(0.0)).astype(np.float32)
    xs = blocks.reshape(n, ns, 1, sub)  # broadcast against the 16 gains
    y = (xs * inv[:, None, :, None]).astype(np.float32)  # [n, ns, 16, sub]
    idx = np.searchsorted(cb.thresholds, y, side="left")
    rec = (cb.centroids[idx] * scales[:, None, :, None]).astype(np.float32)
    err = np.cumsum((xs.astype(np.float64) - rec.astype(np.float64)) ** 2, axis=3)[..., -1]  # [n, ns, 16]
    code = np.argmin(err, axis=2)  # first minimum: the lowest code on a tie
    chosen = np.take_along_axis(idx, code[:, :, None, None], axis=2)[:, :, 0, :].reshape(n, BLOCK)
    codes = code.astype(np.uint8)
    if ns % 2:
        codes = np.concatenate([codes, np.zeros((n, 1), dtype=np.uint8)], axis=1)
    out = np.empty((n, block_bytes(bits)), dtype=np.uint8)
    out[:, :2] = norms.astype("<f2").view(np.uint8).reshape(-1, 2)
    ncode = (ns + 1) // 2
    out[:, 2 : 2 + ncode] = codes[:, 0::2] | (codes[:, 1::2] << 4)
    out[:, 2 + ncode :] = _pack_indices(chosen, bits)
    return out.tobytes()


def dequantize(data: bytes, mode: str) -> np.ndarray:
    bits = MODES[mode]
    cb = lloyd_max(bits)
    ns, sub, ncode = n_sub(bits), SUB_BLOCK[bits], (n_sub(bits) + 1) // 2
    raw = np.frombuffer(data, dtype=np.uint8).reshape(-1, block_bytes(bits))
    norms = raw[:, :2].copy().view("<f2").reshape(-1)
    code_bytes = raw[:, 2 : 2 + ncode]
    codes = np.stack([code_bytes & 15, code_bytes >> 4], axis=2).reshape(raw.shape[0], -1)[:, :ns]
    scale = np.take_along_axis(_scales(norms), codes.astype(np.int64), axis=1)  # [n, ns]
    idx = _unpack_indices(raw[:, 2 + ncode :], bits).reshape(raw.shape[0], ns, sub)
    return (cb.centroids[idx] * scale[:, :, None]).astype(np.float32).reshape(-1)


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
