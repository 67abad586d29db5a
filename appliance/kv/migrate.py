"""Moving live sequences between KV cache types without prefilling them again.

A sequence's state is read out of one context (`llama_state_seq_get_data`), its K/V rows are
converted to the new types (appliance.kv.state.convert: ggml's own row codecs, with llama.cpp's
Hadamard rotation applied or undone between unrotated f16 and rotated quantized types) and
written into a context of the new types (`llama_state_seq_set_data`). The same conversion
compresses saved states at rest (`compress`/`expand`).

`stage` converts every live state into host memory, so that the old context can be freed
before the new one is created (the runner's way: the peak is the larger context plus the live
states, not both contexts); `migrate` goes from one context straight into another.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Iterable

import llama_cpp as lc

from . import state as kv_state
from .ggml_rows import GGML_TYPES, TYPE_NAMES

# EIE_KV_MIGRATE=direct: create the new context before freeing the old one (the comparison in
# bench/kv_migration_peak.py)
DIRECT = os.environ.get("EIE_KV_MIGRATE") == "direct"
COMPRESSIBLE = {"f16", "q8_0"}  # at rest, only these are re-encoded (a turbo state is kept as is)


class MigrationError(RuntimeError):
    pass


def _head_dims(metadata: dict[str, str]) -> tuple[int, int]:
    arch = metadata.get("general.architecture", "")

    def num(key: str) -> int | None:
        v = metadata.get(f"{arch}.{key}")
        return int(float(v)) if v not in (None, "") else None

    n_embd, n_head = num("embedding_length") or 0, num("attention.head_count") or 1
    head_k = num("attention.key_length") or n_embd // n_head
    head_v = num("attention.value_length") or n_embd // n_head
    return head_k, head_v


def rotation_sizes(metadata: dict[str, str]) -> tuple[int, int]:
    """The Walsh–Hadamard sizes llama.cpp's attn_rot uses for K and V (0: no rotation).

    K: the largest power of two dividing the head size; V: 64; both only when the head size is
    a multiple of 64 (llama-kv-cache.cpp).
    """
    head_k, head_v = _head_dims(metadata)
    rot_k = 0
    if head_k and head_k % 64 == 0:
        rot_k = 64
        while head_k % (rot_k * 2) == 0:
            rot_k *= 2
    rot_v = 64 if head_v and head_v % 64 == 0 else 0
    return rot_k, rot_v


def read_sequence(ctx: lc.llama_context_p, seq_id: int, size: int | None = None) -> bytearray:
    """A sequence's KV state (`size`: its llama_state_seq_get_size, where the caller has it)."""
    if size is None:
        size = lc.llama_state_seq_get_size(ctx, seq_id)
    buf = bytearray(size)  # llama.cpp writes straight into it: one copy of the state, not two
    got = lc.llama_state_seq_get_data(ctx, (ctypes.c_uint8 * size).from_buffer(buf), size, seq_id)
    if got != size:
        raise MigrationError(f"llama.cpp wrote {got} of {size} bytes of sequence {seq_id}'s state")
    return buf


def write_sequence(ctx: lc.llama_context_p, seq_id: int, data: bytes | bytearray) -> None:
    if isinstance(data, bytearray):
        buf = (ctypes.c_uint8 * len(data)).from_buffer(data)  # no copy
    else:
        buf = ctypes.cast(ctypes.c_char_p(data), ctypes.POINTER(ctypes.c_uint8))  # no copy
    if lc.llama_state_seq_set_data(ctx, buf, len(data), seq_id) != len(data):
        raise MigrationError(f"llama.cpp refused the state of sequence {seq_id}")


def convert_bytes(data: bytes, type_k: str, type_v: str, rot: tuple[int, int]) -> bytes:
    parsed = kv_state.parse(data)
    out = kv_state.convert(parsed, GGML_TYPES[type_k], GGML_TYPES[type_v], rot_k=rot[0], rot_v=rot[1])
    return out.to_bytes()


def migrate(
    old_ctx: lc.llama_context_p,
    new_ctx: lc.llama_context_p,
    seq_ids: Iterable[int],
    *,
    type_k: str,
    type_v: str,
    rot: tuple[int, int],
    on_sequence: Callable[[int, int, int], None] | None = None,
) -> None:
    """Copy the given sequences from `old_ctx` into `new_ctx` (whose KV types are type_k/type_v)."""
    for seq_id in seq_ids:  # one state in host memory at a time
        unstage(new_ctx, stage(old_ctx, [seq_id], type_k=type_k, type_v=type_v, rot=rot, on_sequence=on_sequence))


def stage(
    ctx: lc.llama_context_p,
    seq_ids: Iterable[int],
    *,
    type_k: str,
    type_v: str,
    rot: tuple[int, int],
    on_sequence: Callable[[int, int, int], None] | None = None,
) -> list[tuple[int, bytes]]:
    """The given sequences' states read out of `ctx` and converted to type_k/type_v, each with its
    sequence id: what `unstage` writes into a context of those types."""
    staged: list[tuple[int, bytes]] = []
    for seq_id in seq_ids:
        raw = read_sequence(ctx, seq_id)
        converted = convert_bytes(raw, type_k, type_v, rot)
        staged.append((seq_id, converted))
        if on_sequence:
            on_sequence(seq_id, len(raw), len(converted))
    return staged


def unstage(ctx: lc.llama_context_p, staged: Iterable[tuple[int, bytes]]) -> None:
    for seq_id, data in staged:
        write_sequence(ctx, seq_id, data)


def compress(data: bytes, mode: str, rot: tuple[int, int]) -> bytes:
    """A saved sequence state with its f16/q8_0 K/V rows re-encoded in a TurboQuant mode."""
    parsed = kv_state.parse(data)
    if not {TYPE_NAMES.get(t) for t in parsed.kv_types()} <= COMPRESSIBLE:
        return data
    target = GGML_TYPES[mode]
    return kv_state.convert(parsed, target, target, rot_k=rot[0], rot_v=rot[1]).to_bytes()


def expand(data: bytes, type_k: str, type_v: str, rot: tuple[int, int]) -> bytes:
    """A stored state converted back to the types of the context it is restored into."""
    return convert_bytes(data, type_k, type_v, rot)
