"""What llama.cpp takes in a GGUF at load and aborts the process on at the first decode, checked
before any load (in the child of engine/gguf_header.py, after its trial load and context).

Found by mutating a tiny model's file (tests/tiny_llama.py): a negative or NaN RMS-norm epsilon
fails `GGML_ASSERT(eps >= 0.0f)` in the CPU kernel; a norm weight stored quantized aborts the
element-wise multiply ("unsupported types"); a matrix stored as I32 or F64 has no dot product in
the CPU backend, and the decode calls a null function pointer (SIGSEGV).
"""

from __future__ import annotations

import math

FLOAT_TYPES = {"F32", "F16", "BF16"}
NO_DOT_PRODUCT = {"I8", "I16", "I32", "I64", "F64"}


def decode_problem(metadata: dict[str, str], tensors: dict[str, tuple[str, int]]) -> str | None:
    """Why decoding with this file would abort llama.cpp, or None. `tensors`: name -> (ggml type
    name, bytes), as engine/gguf_tensors.table gives them."""
    arch = metadata.get("general.architecture", "")
    for key in (f"{arch}.attention.layer_norm_rms_epsilon", f"{arch}.attention.layer_norm_epsilon"):
        raw = metadata.get(key)
        if raw is None:
            continue
        try:
            eps = float(raw)
        except ValueError:
            continue
        if math.isnan(eps) or eps < 0:
            return f"{key} is {raw}: a norm's epsilon must be 0 or more"
    for name, (kind, _) in tensors.items():
        if not name.endswith(".weight"):
            continue
        if "norm" in name.rsplit(".", 2)[-2] and kind not in FLOAT_TYPES:
            return f"tensor {name!r} is {kind}: a norm's weights must be F32, F16 or BF16"
        if kind in NO_DOT_PRODUCT:
            return f"tensor {name!r} is {kind}, which llama.cpp cannot multiply with"
    return None
