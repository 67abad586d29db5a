"""The second copy of a tied output matrix that llama.cpp's CPU backend keeps in a repacked layout.

A model whose output layer reads the token embeddings again (no output.weight in the GGUF) has one
matrix in the file and two uses: the input lookup reads the file's layout, and where one of ggml's
extra CPU buffer types has kernels for the matrix's type, the output matmul takes a repacked copy
of its own. ggml asks them in order (ggml-cpu.cpp, `ggml_backend_cpu_get_extra_buffer_types`):
- the AMX buffer, on a host with AMX and a build with it (the setup build on such a host, the
  release build's sapphirerapids variant). Measured: SmolLM2-135M (Q8_0 embeddings) 32 MiB more
  than the file, Gemma 3 270M 190 MiB;
- CPU_REPACK (ggml-cpu/repack.cpp, `ggml_repack_get_optimal_repack_type`): interleaved blocks of
  the same size, for Q4_0, Q4_K, IQ4_NL and MXFP4 on AVX2, Q2_K on AVX-512, and Q4_0, Q4_K-Q6_K,
  Q8_0, IQ4_NL, MXFP4 on ARM with dotprod or i8mm (a Raspberry Pi 5: Gemma 3 270M's Q8_0
  embeddings, 170 MiB). RISC-V's layouts depend on a compile flag the backend does not report
  and are not counted.
The estimates count that copy (estimate.py); llama.cpp's own report of the load counts it too
(patch 0010 reports what a buffer mapped from the file holds).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .estimate import GgufShape

# ggml-cpu/amx: the types with AMX kernels (qtype_has_amx_kernels), the packed size over the file's
# (Q8_0 tiles carry 16 int32 compensations per 16 rows and block: 34-byte blocks packed in 38), and
# the multiple a row's length must be of (supports_op; the output count must be one of 32).
AMX_TYPES = {"Q4_0": (1.0, 32), "Q4_1": (1.0, 32), "Q8_0": (38 / 34, 32), "Q4_K": (1.0, 256),
             "Q5_K": (1.0, 256), "Q6_K": (1.0, 256), "IQ4_XS": (1.0, 256)}
AMX_OUTPUTS_ALIGN = 32

# ggml-cpu/repack.cpp: per type, the CPU backend features (all of them) under which a layout exists,
# each with the multiple the output count must be of. The interleaved blocks are the file's blocks
# reordered, so the copy is as large as the matrix.
_I8MM, _DOT = ("NEON", "MATMUL_INT8"), ("NEON", "DOTPROD")
CPU_REPACK_LAYOUTS: dict[str, tuple[tuple[tuple[str, ...], int], ...]] = {
    "Q4_0": ((("AVX2",), 8), (("SVE", "MATMUL_INT8", "SVE_CNT=32"), 8), (_I8MM, 4), (_DOT, 4), (("VXE",), 4)),
    "Q4_K": ((("AVX2",), 8), (_I8MM, 8), (_DOT, 8)),
    "Q2_K": ((("AVX512",), 8),),
    "Q5_K": ((_I8MM, 8), (_DOT, 8)),
    "Q6_K": ((_I8MM, 8), (_DOT, 8)),
    "IQ4_NL": ((("AVX2",), 8), (_DOT, 4)),
    "MXFP4": ((("AVX2",), 8), (_DOT, 4)),
    "Q8_0": ((_I8MM, 4), (_DOT, 4)),
    "Q1_0": ((_I8MM, 4), (_DOT, 4)),
}


def tied_output(tensors: Mapping[str, tuple[str, int]]) -> tuple[str, int]:
    """(type, bytes) of the token embeddings when the GGUF has no separate output matrix, else ("", 0);
    `tensors` is the file's tensor table (engine/gguf_tensors.table)."""
    embd = tensors.get("token_embd.weight")
    if embd is None or "output.weight" in tensors:
        return "", 0
    return embd


def repacked_output_bytes(shape: GgufShape, features: Mapping[str, str] | None = None) -> int:
    """Bytes of the repacked copy of `shape`'s tied output matrix that a CPU backend with
    `features` (its ggml feature list; default: this host's loaded backend, none where a GPU
    backend takes the output layer) keeps."""
    if not shape.tied_output_type:
        return 0
    if features is None:
        features = cpu_output_features()
        if features is None:
            return 0
    amx = AMX_TYPES.get(shape.tied_output_type)
    if amx is not None and _amx_runs(features) and not shape.n_embd % amx[1] and not shape.n_vocab % AMX_OUTPUTS_ALIGN:
        return int(shape.tied_output_bytes * amx[0])
    if features.get("REPACK") == "1" and _has_repack_layout(shape.tied_output_type, shape.n_vocab, features):
        return shape.tied_output_bytes
    return 0


def _has_repack_layout(type_name: str, n_outputs: int, features: Mapping[str, str]) -> bool:
    def has(flag: str) -> bool:
        name, _, value = flag.partition("=")
        return features.get(name) == (value or "1")

    return any(all(map(has, needs)) and n_outputs % multiple == 0
               for needs, multiple in CPU_REPACK_LAYOUTS.get(type_name, ()))


@functools.cache
def cpu_output_features() -> dict[str, str] | None:
    """The feature list of the CPU backend that runs the output layer; None where a GPU backend
    takes it."""
    from ..engine import backends, native

    native.init_backend()
    if native.gpu_backend() is not None:
        return None
    return dict(backends.registry.features().get("CPU", {}))


def _amx_runs(features: Mapping[str, str]) -> bool:
    """Whether a CPU backend with `features` runs AMX here: built with it, on a host that has it."""
    return features.get("AMX_INT8") == "1" and host_has_amx()


@functools.cache
def build_has_amx() -> bool:
    """Whether this host has AMX and the loaded llama.cpp CPU backend was built with it."""
    from ..engine import backends, native

    if not host_has_amx():
        return False
    native.init_backend()
    return _amx_runs(backends.registry.features().get("CPU", {}))


@functools.cache
def host_has_amx() -> bool:
    """Whether this CPU has AMX with int8 (Linux: /proc/cpuinfo)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return "amx_int8" in flags.split()
