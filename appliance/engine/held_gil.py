"""llama.cpp calls that keep the GIL: the short ones a runner makes between two decodes.

ctypes releases the GIL around every foreign call. For a call of a few microseconds that is a
cost, not a help: the event loop thread, which has the previous tokens to stream, takes the GIL
at the release, and the runner then waits for it to be handed back (up to a whole batch of SSE
writes) before it can go on to the next decode; the ggml threads idle meanwhile. Measured in a
runner serving SmolLM2's speculative JSON answers (2026-12-01): `llama_memory_seq_rm` after a
rejected draft took 0.15 ms (median) and the pick of a token (`llama_get_logits_ith` and an
argmax) 58 µs, most of it waiting for the GIL. These bindings call the same functions of the
same library with the GIL held; `llama_decode` (milliseconds, during which the event loop
should run) keeps ctypes' release.
"""

from __future__ import annotations

import ctypes

from llama_cpp import llama_cpp as _bindings


def _holding(name: str) -> ctypes._CFuncPtr:
    """`name` from libllama with the argument and result types llama_cpp declared for it, called
    without releasing the GIL (ctypes' PYFUNCTYPE prototype)."""
    declared = getattr(_bindings._lib, name)
    proto = ctypes.PYFUNCTYPE(declared.restype, *declared.argtypes)
    return proto((name, _bindings._lib))


get_logits_ith = _holding("llama_get_logits_ith")
memory_seq_rm = _holding("llama_memory_seq_rm")
sampler_sample = _holding("llama_sampler_sample")
sampler_accept = _holding("llama_sampler_accept")
sampler_apply = _holding("llama_sampler_apply")
token_to_piece = _holding("llama_token_to_piece")

__all__ = ["get_logits_ith", "memory_seq_rm", "sampler_sample", "sampler_accept", "sampler_apply",
           "token_to_piece"]
