"""KV rows in ggml types: encode from and decode to float32 with ggml's own row functions.

Uses `ggml_quantize_chunk` and the type traits' `to_float` from the libggml-base that llama.cpp
loads, so a converted row is exactly what llama.cpp itself would have stored (for the
TurboQuant types that is the shared C codec of native/turboquant).
"""

from __future__ import annotations

import ctypes
from functools import lru_cache
from pathlib import Path

import numpy as np

# The ggml types a KV cache can hold, by name.
GGML_TYPES: dict[str, int] = {
    "f32": 0,
    "f16": 1,
    "q4_0": 2,
    "q4_1": 3,
    "q5_0": 6,
    "q5_1": 7,
    "q8_0": 8,
    "iq4_nl": 20,
    "bf16": 30,
    # TurboQuant, added by native/patches/0001-turboquant-kv-types.patch
    "turbo4": 43,
    "turbo3": 44,
    "turbo2": 45,
}
TYPE_NAMES = {v: k for k, v in GGML_TYPES.items()}
_UNROTATED = {0, 1, 30}  # llama.cpp rotates K/V (attn_rot) only for quantized types


class _Traits(ctypes.Structure):
    _fields_ = [
        ("type_name", ctypes.c_char_p),
        ("blck_size", ctypes.c_int64),
        ("blck_size_interleave", ctypes.c_int64),
        ("type_size", ctypes.c_size_t),
        ("is_quantized", ctypes.c_bool),
        ("to_float", ctypes.c_void_p),
        ("from_float_ref", ctypes.c_void_p),
    ]


_TO_FLOAT = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_float), ctypes.c_int64)


@lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    import llama_cpp

    lib = ctypes.CDLL(str(Path(llama_cpp.__file__).parent / "lib" / "libggml-base.so"))
    lib.ggml_get_type_traits.restype = ctypes.POINTER(_Traits)
    lib.ggml_get_type_traits.argtypes = [ctypes.c_int]
    lib.ggml_quantize_chunk.restype = ctypes.c_size_t
    lib.ggml_quantize_chunk.argtypes = [
        ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64,
        ctypes.c_void_p,
    ]
    return lib


def known(type_id: int) -> bool:
    return type_id in TYPE_NAMES


@lru_cache(maxsize=None)
def _block(type_id: int) -> tuple[int, int]:
    """(values per block, bytes per block) from the loaded library's type traits."""
    traits = _lib().ggml_get_type_traits(type_id).contents
    return int(traits.blck_size), int(traits.type_size)


def rotated(type_id: int) -> bool:
    return type_id not in _UNROTATED


def row_bytes(type_id: int, n: int) -> int:
    blck, size = _block(type_id)
    if n % blck:
        raise ValueError(f"row of {n} values is not a whole number of blocks of {blck}")
    return n // blck * size


def values_per_row(type_id: int, nbytes: int) -> int:
    blck, size = _block(type_id)
    if nbytes % size:
        raise ValueError(f"row of {nbytes} bytes is not a whole number of blocks of {size}")
    return nbytes // size * blck


def decode(type_id: int, data: bytes, n_rows: int, n: int) -> np.ndarray:
    """float32 [n_rows, n] from rows of `type_id`."""
    if type_id == 0:
        return np.frombuffer(data, dtype="<f4").reshape(n_rows, n).copy()
    if type_id == 1:
        return np.frombuffer(data, dtype="<f2").reshape(n_rows, n).astype(np.float32)
    out = np.empty((n_rows, n), dtype=np.float32)
    traits = _lib().ggml_get_type_traits(type_id).contents
    to_float = _TO_FLOAT(traits.to_float)
    buf = ctypes.create_string_buffer(bytes(data), len(data))
    to_float(ctypes.addressof(buf), out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), n_rows * n)
    return out


def encode(type_id: int, values: np.ndarray) -> bytes:
    """Rows of `type_id` from float32 [n_rows, n]."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    n_rows, n = values.shape
    if type_id == 0:
        return values.astype("<f4").tobytes()
    if type_id == 1:
        return values.astype("<f2").tobytes()
    out = ctypes.create_string_buffer(n_rows * row_bytes(type_id, n))
    _lib().ggml_quantize_chunk(type_id, values.ctypes.data, out, 0, n_rows, n, None)
    return out.raw


@lru_cache(maxsize=8)
def hadamard_matrix(n: int) -> np.ndarray:
    """The orthonormal Walsh–Hadamard matrix llama.cpp builds for attn_rot (symmetric, H·H = I)."""
    if n < 1 or n & (n - 1):
        raise ValueError("rotation size must be a power of two")
    h = np.ones((1, 1), dtype=np.float64)
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return (h / np.sqrt(n)).astype(np.float32)


def hadamard(values: np.ndarray, n: int) -> np.ndarray:
    """Rotate each consecutive group of `n` values of every row (its own inverse)."""
    rows, width = values.shape
    if width % n:
        raise ValueError(f"row of {width} values is not a multiple of the rotation size {n}")
    return (values.reshape(-1, n) @ hadamard_matrix(n)).reshape(rows, width)
