"""The second copy of a tied output matrix that llama.cpp's CPU backend keeps on hosts with AMX.

A model whose output layer reads the token embeddings again (no output.weight in the GGUF) has one
matrix in the file and two uses: the input lookup reads the file's layout, and ggml's AMX buffer
type (on a host with AMX: the setup build and the release build's sapphirerapids variant) takes the
output matmul into a repacked copy of its own. Measured on SmolLM2-135M (Q8_0 embeddings): 32 MiB
more than the file, Gemma 3 270M: 190 MiB. The estimates count that copy (estimate.py); llama.cpp's
own report of the load counts it too (patch 0010 reports what a buffer mapped from the file holds).
"""

from __future__ import annotations

import functools
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


def tied_output(path: Path) -> tuple[str, int]:
    """(type, bytes) of the token embeddings when the GGUF has no separate output matrix, else ("", 0)."""
    from ..engine import gguf_tensors

    tensors = gguf_tensors.read(path, ("token_embd.weight", "output.weight"))
    embd = tensors.get("token_embd.weight")
    if embd is None or "output.weight" in tensors:
        return "", 0
    return embd


def repacked_output_bytes(shape: GgufShape) -> int:
    """Bytes of the repacked copy of `shape`'s tied output matrix that this host's build will keep."""
    kind = AMX_TYPES.get(shape.tied_output_type)
    if kind is None or shape.n_embd % kind[1] or shape.n_vocab % AMX_OUTPUTS_ALIGN or not cpu_repacks_with_amx():
        return 0
    return int(shape.tied_output_bytes * kind[0])


@functools.cache
def cpu_repacks_with_amx() -> bool:
    """Whether the output layer runs on the CPU (no GPU backend takes it) with ggml's AMX buffer."""
    from ..engine import native

    return native.gpu_backend() is None and build_has_amx()


@functools.cache
def build_has_amx() -> bool:
    """Whether this host has AMX and the loaded llama.cpp CPU backend was built with it."""
    from ..engine import backends, native

    if not host_has_amx():
        return False
    native.init_backend()
    return backends.registry.features().get("CPU", {}).get("AMX_INT8") == "1"


def host_has_amx() -> bool:
    """Whether this CPU has AMX with int8 (Linux: /proc/cpuinfo)."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return False
    return "amx_int8" in flags.split()
