"""Constrained decoding: one sequence's GBNF grammar, compiled by llama.cpp's grammar sampler.

The runner asks the grammar about the token it would pick anyway (one candidate: ~10 µs) and
masks the whole vocabulary only when that token is refused. A full mask costs 6-12 ms for
SmolLM2's 49k tokens and 40-65 ms for Gemma 3's 262k on this machine's core, more than a
decode step, so the check comes first, as llama.cpp's common sampler does. For a greedy pick the
result is the same token as masking first (the argmax over allowed tokens); for a draw, drawing
from p and redrawing from p masked when the token is refused gives each allowed token
p(t) + (1 - Z) p(t) / Z = p(t) / Z, the masked distribution, without truncation (top-k/top-p/
min-p then act on the masked candidates, as in llama.cpp).
"""

from __future__ import annotations

import ctypes

import llama_cpp as lc
import numpy as np

from . import held_gil
from .native import Vocab

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data


class GrammarError(ValueError):
    """A grammar llama.cpp cannot compile."""


_REFUSED = ("llama.cpp could not compile the grammar: a syntax error, an undefined rule, no 'root' rule, left "
            "recursion or a repetition minimum over 2000 (the server log has the parser's message)")


def _array(cand: np.ndarray) -> lc.llama_token_data_array:
    return lc.llama_token_data_array(data=cand.ctypes.data_as(ctypes.POINTER(lc.llama_token_data)),
                                     size=len(cand), selected=-1, sorted=False)


class Constraint:
    """A compiled grammar and its state: which tokens may come next, advanced token by token.

    Used by one thread at a time (a runner's); `close` frees it."""

    def __init__(self, vocab: Vocab, text: str):
        self._smpl = lc.llama_sampler_init_grammar(vocab.handle, text.encode("utf-8"), b"root")
        if not self._smpl:
            raise GrammarError(_REFUSED)
        self._vocab = vocab
        self._one = np.zeros(1, dtype=TOKEN_DATA)
        self._one_arr = _array(self._one)

    def allows(self, token: int) -> bool:
        one = self._one
        one["id"] = token
        one["logit"] = 0.0
        self._one_arr.size = 1
        held_gil.sampler_apply(self._smpl, ctypes.byref(self._one_arr))
        return bool(np.isfinite(one["logit"][0]))

    def mask(self, cand: np.ndarray) -> bool:
        """Set the logit of every refused candidate to -inf (in place); False if none is left."""
        lc.llama_sampler_apply(self._smpl, ctypes.byref(_array(cand)))
        return bool(np.isfinite(cand["logit"]).any())

    def accept(self, token: int) -> None:
        """Advance past `token`, which the grammar allows (an end-of-generation token is not
        accepted: llama.cpp aborts on one the grammar does not allow, and nothing follows it)."""
        if not self._vocab.is_eog(token):
            held_gil.sampler_accept(self._smpl, token)

    def close(self) -> None:
        if self._smpl:
            lc.llama_sampler_free(self._smpl)
            self._smpl = None


def check(vocab: Vocab | None, text: str) -> None:
    """Raise GrammarError if llama.cpp cannot compile `text` for this vocabulary (None: for no
    vocabulary, where a token reference such as <[42]> cannot compile)."""
    smpl = lc.llama_sampler_init_grammar(vocab.handle if vocab is not None else None, text.encode("utf-8"), b"root")
    if not smpl:
        raise GrammarError(_REFUSED + (" (token references need a model: not in group requests)" if vocab is None else ""))
    lc.llama_sampler_free(smpl)
