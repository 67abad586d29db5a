"""Control vectors (llama.cpp's llama_adapter_cvec; llama-server's --control-vector): a direction
per layer that is added to that layer's output at every token, steering what the model writes
without changing its weights.

A control vector file is a GGUF of F32 tensors `direction.<layer>`, one model width each (what
repeng and llama.cpp's cvector-generator write). A model's files are scaled and summed into one
vector, which every context of the model applies (llama.cpp applies it per context, to every
sequence); `layers` bounds the layers it acts on. llama.cpp has no direction for layer 0, so the
layers that can be steered are 1 .. n_layer - 1.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import llama_cpp as lc
import numpy as np

_DIRECTION = re.compile(r"^direction\.(?P<layer>[0-9]+)$")


class ControlVectorError(Exception):
    """A control vector file that cannot steer this model (unreadable, not directions, another width)."""


@dataclass(frozen=True)
class ControlVector:
    data: np.ndarray  # float32, n_embd per layer from layer 1 (layer 1 at [0:n_embd])
    n_embd: int
    layer_start: int  # the first and last layer it acts on (inclusive)
    layer_end: int

    @property
    def nbytes(self) -> int:
        """What llama.cpp allocates for it: one F32 tensor of the model's width per layer from 1."""
        return int(self.data.nbytes)

    @functools.cached_property
    def identity(self) -> bytes:
        """What a KV state computed with it depends on: its directions and layer range."""
        h = hashlib.blake2b(digest_size=16)
        h.update(f"cvec:{self.layer_start}:{self.layer_end}:".encode())
        h.update(self.data.tobytes())
        return h.digest()


def read(files: Sequence[tuple[Path, float]], n_embd: int, n_layer: int,
         layers: Sequence[int] | None = None) -> ControlVector:
    """The sum of each file's directions times its scale, for a model `n_embd` wide with `n_layer`
    layers, acting on `layers` (default: every layer that can be steered)."""
    top = n_layer - 1
    if top < 1:
        raise ControlVectorError(f"the model has {n_layer} layer(s): none after layer 0 to steer")
    start, end = layers or (1, top)
    if end > top:
        raise ControlVectorError(f"control_vector_layers: the last layer is {end}, but this model's layers "
                                 f"that can be steered are 1..{top}")
    total = np.zeros((top, n_embd), dtype=np.float32)
    for path, scale in files:
        for layer, direction in _directions(path, n_embd, top):
            total[layer - 1] += direction * np.float32(scale)
    return ControlVector(total.reshape(-1), n_embd, start, end)


def _directions(path: Path, n_embd: int, top: int) -> list[tuple[int, np.ndarray]]:
    from gguf import GGMLQuantizationType, GGUFReader  # 0.2 s to import: only where a model has a vector

    if not path.is_file():
        raise ControlVectorError(f"control vector file not found: {path}")
    try:
        reader = GGUFReader(path)
    except Exception as e:  # the gguf package raises ValueError, struct.error, ... on a malformed file
        raise ControlVectorError(f"control vector {path.name} is not a readable GGUF file: {e}") from e
    if not reader.tensors:
        raise ControlVectorError(f"control vector {path.name} has no direction tensors")
    out = []
    for t in reader.tensors:
        m = _DIRECTION.match(t.name)
        if m is None:
            raise ControlVectorError(f"control vector {path.name}: tensor {t.name!r} is not a direction "
                                     "(direction.<layer>)")
        layer = int(m.group("layer"))
        if not 1 <= layer <= top:
            raise ControlVectorError(f"control vector {path.name}: {t.name} is for layer {layer}, but this "
                                     f"model's layers that can be steered are 1..{top}")
        if t.tensor_type != GGMLQuantizationType.F32:
            raise ControlVectorError(f"control vector {path.name}: {t.name} is {t.tensor_type.name}, not F32")
        if int(t.n_elements) != n_embd or any(int(d) != 1 for d in t.shape[1:]):
            raise ControlVectorError(f"control vector {path.name}: {t.name} has shape {[int(d) for d in t.shape]}, "
                                     f"but this model is {n_embd} wide")
        out.append((layer, np.asarray(t.data, dtype=np.float32).reshape(-1)))
    return out


def apply(ctx: lc.llama_context_p, cv: ControlVector) -> None:
    """Set `cv` on a context (before its first decode: the graphs built after it add it)."""
    data = np.ascontiguousarray(cv.data, dtype=np.float32)
    ptr = data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
    if lc.llama_set_adapter_cvec(ctx, ptr, data.size, cv.n_embd, cv.layer_start, cv.layer_end) != 0:
        raise ControlVectorError(f"llama.cpp refused the control vector ({cv.n_embd} wide)")
