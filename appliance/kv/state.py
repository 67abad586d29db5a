"""Reading and rewriting llama.cpp sequence states (`llama_state_seq_get_data` bytes).

A sequence state is the magic and sequence id, then one block per KV cache of the context (two
for interleaved sliding-window models such as Gemma 3: the full-attention cache, then the SWA
cache). Each block holds, per stream, the cell count, the cells' positions and sequence ids,
and per layer the K rows then the V rows of those cells, each layer tagged with its ggml type
and row size. This module parses that layout into arrays of rows so a state can change KV type
(`convert`): the cell metadata is kept byte for byte and only the K/V rows are re-encoded.

Models whose cells carry extra data (M-RoPE, PLE) are refused: their cell records differ.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

from . import ggml_rows

STATE_MAGIC = 0xAF143CD8  # llama.cpp's io_magic at the start of every sequence state


class StateFormatError(ValueError):
    """The bytes are not a sequence state this module understands."""


@dataclass
class LayerRows:
    type_id: int
    row_bytes: int
    data: bytes | memoryview  # n_cells rows of row_bytes (a view into the parsed buffer)


@dataclass
class StreamState:
    cell_count: int
    meta: bytes = b""
    v_trans: int = 0
    k: list[LayerRows] = field(default_factory=list)
    v: list[LayerRows] = field(default_factory=list)


@dataclass
class CacheState:
    streams: list[StreamState]


@dataclass
class SeqState:
    magic: int
    seq_id: int
    caches: list[CacheState]

    def kv_types(self) -> set[int]:
        return {layer.type_id for c in self.caches for s in c.streams for layer in s.k + s.v}

    def to_bytes(self) -> bytes:
        parts: list[bytes | memoryview] = [struct.pack("<Ii", self.magic, self.seq_id)]
        for cache in self.caches:
            parts.append(struct.pack("<I", len(cache.streams)))
            for s in cache.streams:
                parts.append(struct.pack("<I", s.cell_count))
                if not s.cell_count:
                    continue
                parts.append(s.meta)
                parts.append(struct.pack("<II", s.v_trans, len(s.k)))
                for layer in s.k + s.v:
                    parts.append(struct.pack("<iQ", layer.type_id, layer.row_bytes))
                    parts.append(layer.data)
        return b"".join(parts)


class _Reader:
    def __init__(self, data: bytes):
        self.data = memoryview(data)
        self.pos = 0

    def take(self, n: int) -> memoryview:
        """The next n bytes, as a view (no copy)."""
        if self.pos + n > len(self.data):
            raise StateFormatError("sequence state is truncated")
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def i32(self) -> int:
        return struct.unpack("<i", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def done(self) -> bool:
        return self.pos == len(self.data)


def _meta(r: _Reader, cell_count: int) -> bytes:
    start = r.pos
    for _ in range(cell_count):
        r.i32()  # position
        n_seq = r.u32()
        if n_seq > 4096:
            raise StateFormatError("implausible sequence count in a cell (cells with extra data?)")
        r.take(4 * n_seq)
    return bytes(r.data[start : r.pos])


def _layer(r: _Reader, cell_count: int) -> LayerRows:
    type_id = r.i32()
    if not ggml_rows.known(type_id):
        raise StateFormatError(f"unsupported ggml type {type_id} in a sequence state")
    row_bytes = r.u64()
    return LayerRows(type_id, row_bytes, r.take(cell_count * row_bytes))


def parse(data: bytes) -> SeqState:
    r = _Reader(data)
    magic, seq_id = r.u32(), r.i32()
    if magic != STATE_MAGIC:
        raise StateFormatError("not a llama.cpp sequence state (bad magic)")
    caches = []
    while not r.done():
        n_stream = r.u32()
        if not 0 < n_stream <= 4096:
            raise StateFormatError(f"implausible stream count {n_stream}")
        streams = []
        for _ in range(n_stream):
            s = StreamState(r.u32())
            if s.cell_count:
                s.meta = _meta(r, s.cell_count)
                s.v_trans, n_layer = r.u32(), r.u32()
                if s.v_trans:
                    raise StateFormatError("transposed V (no flash attention) is not supported")
                s.k = [_layer(r, s.cell_count) for _ in range(n_layer)]
                s.v = [_layer(r, s.cell_count) for _ in range(n_layer)]
            streams.append(s)
        caches.append(CacheState(streams))
    return SeqState(magic, seq_id, caches)


def layer_values(layer: LayerRows, cell_count: int) -> np.ndarray:
    """The rows of a layer as float32 [cell_count, n_embd]."""
    n = ggml_rows.values_per_row(layer.type_id, layer.row_bytes)
    return ggml_rows.decode(layer.type_id, layer.data, cell_count, n)


def convert(state: SeqState, type_k: int, type_v: int, *, rot_k: int, rot_v: int) -> SeqState:
    """The same state with its K rows in `type_k` and V rows in `type_v`.

    llama.cpp stores quantized K and V rotated (a Walsh–Hadamard transform over blocks of
    `rot_k`/`rot_v` values, mainline's `attn_rot`) and f16/f32/bf16 rows unrotated, so a
    conversion between the two kinds applies the rotation or its inverse (it is its own).
    A rotation size of 0 means llama.cpp does not rotate that side (head size not a multiple
    of 64).
    """
    out = []
    for cache in state.caches:
        streams = []
        for s in cache.streams:
            if not s.cell_count:
                streams.append(s)
                continue
            k = [_convert_layer(layer, s.cell_count, type_k, rot_k) for layer in s.k]
            v = [_convert_layer(layer, s.cell_count, type_v, rot_v) for layer in s.v]
            streams.append(StreamState(s.cell_count, s.meta, s.v_trans, k, v))
        out.append(CacheState(streams))
    return SeqState(state.magic, state.seq_id, out)


def _convert_layer(layer: LayerRows, cells: int, target: int, rot: int) -> LayerRows:
    if layer.type_id == target:
        return layer
    values = layer_values(layer, cells)
    if rot and ggml_rows.rotated(layer.type_id) != ggml_rows.rotated(target):
        values = ggml_rows.hadamard(values, rot)
    data = ggml_rows.encode(target, values)
    return LayerRows(target, ggml_rows.row_bytes(target, values.shape[1]), data)


def with_streams(state: SeqState, n_stream: int) -> SeqState:
    """The same sequence laid out for a context with `n_stream` KV streams.

    A sequence lives in one stream; llama.cpp only checks that the stream count matches and
    restores the cells into the destination sequence's own stream. Stored states keep the
    layout they were saved with (one stream with cells, the rest empty) and are laid out for the
    restoring context on the way back, so they restore into any n_parallel.
    """
    caches = []
    for cache in state.caches:
        full = [s for s in cache.streams if s.cell_count]
        if len(full) > 1:
            raise StateFormatError("a sequence state with cells in more than one stream")
        streams = full + [StreamState(0) for _ in range(n_stream - len(full))]
        if len(streams) != n_stream:
            raise StateFormatError(f"cannot lay out {len(full)} streams as {n_stream}")
        caches.append(CacheState(streams))
    return SeqState(state.magic, state.seq_id, caches)


def cell_count(state: SeqState) -> int:
    """Cells of the sequence in its first (full-attention) cache."""
    return sum(s.cell_count for s in state.caches[0].streams) if state.caches else 0
