"""Control vector GGUFs (engine/control_vector.py) written with the `gguf` package as repeng and
llama.cpp's cvector-generator lay them out: architecture `controlvector`, one F32 tensor
`direction.<layer>` per layer, the model's width each."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np


def write_control_vector(path: Path, directions: dict[int, np.ndarray], *, names: dict[int, str] | None = None,
                         dtype: type = np.float32) -> Path:
    """Write `directions` (layer -> vector); `names` overrides a layer's tensor name (malformed files)."""
    w = gguf.GGUFWriter(str(path), "controlvector")
    w.add_string("controlvector.model_hint", "llama")
    w.add_uint32("controlvector.layer_count", len(directions))
    for layer, vector in directions.items():
        w.add_tensor((names or {}).get(layer, f"direction.{layer}"), np.asarray(vector, dtype=dtype))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
