"""Type and size of every tensor in a GGUF file, read by ggml's own GGUF reader (libggml-base, which
libllama loaded: the same parser as the load, and nothing the frozen build has to bundle)."""

from __future__ import annotations

import contextlib
import ctypes
import functools
from collections.abc import Iterator
from pathlib import Path

from . import backends


class _InitParams(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.c_void_p)]


@functools.cache
def _lib() -> ctypes.CDLL:
    lib = ctypes.CDLL(str(backends.libggml_path()))  # the gguf_* symbols come from its libggml-base
    vp = ctypes.c_void_p
    for name, res, args in (("gguf_init_from_file", vp, [ctypes.c_char_p, _InitParams]),
                            ("gguf_free", None, [vp]),
                            ("gguf_get_tensor_type", ctypes.c_int, [vp, ctypes.c_int64]),
                            ("gguf_get_tensor_size", ctypes.c_size_t, [vp, ctypes.c_int64]),
                            ("gguf_get_n_tensors", ctypes.c_int64, [vp]),
                            ("gguf_get_tensor_name", ctypes.c_char_p, [vp, ctypes.c_int64]),
                            ("ggml_type_name", ctypes.c_char_p, [ctypes.c_int])):
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = res, args
    return lib


def table(path: Path) -> dict[str, tuple[str, int]]:
    """Every tensor's name -> (ggml type name, bytes); {} when the file cannot be read."""
    with _opened(path) as (lib, ctx):
        if not ctx:
            return {}
        return {lib.gguf_get_tensor_name(ctx, i).decode("utf-8", "replace"):
                (lib.ggml_type_name(lib.gguf_get_tensor_type(ctx, i)).decode().upper(),
                 int(lib.gguf_get_tensor_size(ctx, i)))
                for i in range(lib.gguf_get_n_tensors(ctx))}


def sizes(tensors: dict[str, tuple[str, int]]) -> dict[str, int]:
    """name -> bytes of a `table`."""
    return {name: size for name, (_, size) in tensors.items()}


@contextlib.contextmanager
def _opened(path: Path) -> Iterator[tuple[ctypes.CDLL, int | None]]:
    """ggml's GGUF context of the file's header (None when it cannot be read), freed afterwards."""
    from . import native

    native.init_backend()  # loads libllama and so the libggml it uses
    lib = _lib()
    ctx = lib.gguf_init_from_file(str(path).encode(), _InitParams(True, None))
    try:
        yield lib, ctx
    finally:
        if ctx:
            lib.gguf_free(ctx)
