"""Constrained decoding: one sequence's GBNF grammar, compiled by llama.cpp's grammar sampler.

A mask of the whole vocabulary costs 6-12 ms for SmolLM2's 49k tokens and 40-65 ms for Gemma
3's 262k on this machine's core, more than a decode step. So the runner asks the grammar about
the token it would pick anyway (one candidate: ~10 µs), as llama.cpp's common sampler does, and
when that token is refused:
- a greedy pick takes the best allowed token of the SHORTLIST highest logits when that decides
  it (best_in_shortlist), which is the argmax over the allowed tokens exactly;
- a draw is redrawn from the chain's distribution until an allowed token comes (redraw): each
  allowed token then comes out with p(t) / Z (Z: the allowed mass), the chain's distribution
  masked, at the cost of a cumulative sum and a few 10 µs checks.
Only when neither settles it is the whole vocabulary masked and the chain applied to what is
left (then top-k/top-p/min-p act on the allowed candidates, as in llama.cpp).
"""

from __future__ import annotations

import contextlib
import ctypes

import llama_cpp as lc
import numpy as np

from . import held_gil
from .native import Vocab

TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])  # llama_token_data


# A refused greedy token is looked for among this many highest logits, and a refused draw redrawn
# up to this many times, before the whole vocabulary is masked (40-65 ms for Gemma 3's 262k tokens).
SHORTLIST = 64
REDRAWS = 256


class GrammarError(ValueError):
    """A grammar llama.cpp cannot compile."""


_REFUSED = ("llama.cpp could not compile the grammar: a syntax error, an undefined rule, no 'root' rule, left "
            "recursion or a repetition minimum over 2000 (the server log has the parser's message)")


def _compile(vocab: Vocab | None, text: str, triggers: tuple[int, ...] = ()) -> lc.llama_sampler_p:
    """llama.cpp's grammar sampler for `text` (None: for no vocabulary, where a token reference
    such as <[42]> cannot compile), lazy with `triggers`; GrammarError when it does not compile.

    A lazy grammar refuses nothing until a trigger token is accepted, and goes on from that token.
    Only tokens trigger here (Constraint watches for text triggers itself): on a trigger text
    llama.cpp replays the rest of the token that completed it into the grammar, and a rest the
    grammar refuses would throw through its C API."""
    handle = vocab.handle if vocab is not None else None
    with vocab.using() if vocab is not None else contextlib.nullcontext():
        if triggers:
            ids = (lc.llama_token * len(triggers))(*triggers)
            smpl = lc.llama_sampler_init_grammar_lazy_patterns(handle, text.encode("utf-8"), b"root", None, 0, ids,
                                                               len(triggers))
        else:
            smpl = lc.llama_sampler_init_grammar(handle, text.encode("utf-8"), b"root")
    if not smpl:
        raise GrammarError(_REFUSED + (" (token references need a model: not in group requests)" if vocab is None else ""))
    return smpl


def _array(cand: np.ndarray) -> lc.llama_token_data_array:
    return lc.llama_token_data_array(data=cand.ctypes.data_as(ctypes.POINTER(lc.llama_token_data)),
                                     size=len(cand), selected=-1, sorted=False)


class Constraint:
    """A compiled grammar and its state: which tokens may come next, advanced token by token.

    Lazy with `triggers`: it refuses nothing until one is written, and from there on holds the
    answer to the grammar, which begins with the trigger. A token trigger (an id) is llama.cpp's
    own. A text trigger (a str: a tag the vocabulary spells in several tokens, or one token that
    may come with text before it) is watched for here: once the answer's text holds it, the grammar
    is advanced over the text from the trigger on (tokenized anew: a grammar reads characters, so
    any spelling of the same text leaves it in the same state). Where the grammar refuses that
    text, the trigger was not the call's start (a tag quoted in prose): it starts afresh and waits
    for the next.

    Used by one thread at a time (a runner's); `close` frees it."""

    def __init__(self, vocab: Vocab, text: str, triggers: tuple[int | str, ...] = ()):
        tokens = tuple(t for t in triggers if isinstance(t, int))
        self._words = tuple(t.encode("utf-8") for t in triggers if isinstance(t, str))
        if tokens and self._words:
            raise ValueError("a grammar's triggers are tokens or texts, not both")
        self._text = text
        self._smpl = _compile(vocab, text, tokens)
        self._vocab = vocab
        self._triggers = frozenset(tokens)
        self.waiting = bool(triggers)  # lazy, and no trigger accepted yet: it refuses nothing
        self._seen = b""  # text triggers: the answer's text not yet searched to its end
        self._one = np.zeros(1, dtype=TOKEN_DATA)
        self._one_arr = _array(self._one)

    @property
    def _watching(self) -> bool:
        """Waiting for a text trigger: the grammar has not started and refuses nothing."""
        return self.waiting and bool(self._words)

    def allows(self, token: int) -> bool:
        return self._watching or self._grammar_allows(token)

    def _grammar_allows(self, token: int) -> bool:
        one = self._one
        one["id"] = token
        one["logit"] = 0.0
        self._one_arr.size = 1
        held_gil.sampler_apply(self._smpl, ctypes.byref(self._one_arr))
        return bool(np.isfinite(one["logit"][0]))

    def mask(self, cand: np.ndarray) -> bool:
        """Set the logit of every refused candidate to -inf (in place); False if none is left."""
        if self._watching:
            return len(cand) > 0
        lc.llama_sampler_apply(self._smpl, ctypes.byref(_array(cand)))
        return bool(np.isfinite(cand["logit"]).any())

    def accept(self, token: int) -> None:
        """Advance past `token`, which the grammar allows (an end-of-generation token is not
        accepted: llama.cpp aborts on one the grammar does not allow, and nothing follows it)."""
        if self._vocab.is_eog(token):
            return
        if self._watching:
            self._watch(self._vocab.piece(token, special=True))
            return
        held_gil.sampler_accept(self._smpl, token)
        if self.waiting and token in self._triggers:
            self.waiting = False

    def _watch(self, piece: bytes) -> None:
        """Text triggers: look for one in the text so far, and start the grammar where it begins."""
        self._seen += piece
        while True:
            found = [(i, w) for w in self._words if (i := self._seen.find(w)) >= 0]
            if not found:
                longest = max(len(w) for w in self._words)
                self._seen = self._seen[-(longest - 1):] if longest > 1 else b""
                return
            start = min(found)[0]
            try:
                rest = self._seen[start:].decode("utf-8")
            except UnicodeDecodeError:  # a character cut between tokens: the next piece completes it
                return
            if self._advance_over(rest):
                self.waiting = False
                self._seen = b""
                return
            self._restart()
            self._seen = self._seen[start + 1:]

    def _advance_over(self, text: str) -> bool:
        """Advance the (not yet started) grammar over `text`; False where it refuses the text."""
        for token in self._vocab.tokenize(text, add_special=False, parse_special=True):
            if not self._grammar_allows(token):
                return False
            held_gil.sampler_accept(self._smpl, token)
        return True

    def _restart(self) -> None:
        lc.llama_sampler_free(self._smpl)
        self._smpl = _compile(self._vocab, self._text)

    def close(self) -> None:
        if self._smpl:
            lc.llama_sampler_free(self._smpl)
            self._smpl = None


def best_in_shortlist(c: Constraint, logits: np.ndarray) -> int | None:
    """The argmax of `logits` over the tokens the grammar allows, when the SHORTLIST highest
    logits tell it: one of them is allowed and above every logit left out, so no token outside
    beats or ties it (ties go to the lowest id, as argmax and llama.cpp's greedy sampler take
    them). None: the whole vocabulary must be masked."""
    if len(logits) <= SHORTLIST:
        return None
    ids = np.argpartition(logits, -SHORTLIST)[-SHORTLIST:]
    short = np.zeros(len(ids), dtype=TOKEN_DATA)
    short["id"] = ids
    short["logit"] = logits[ids]
    if not c.mask(short):
        return None
    best = short["logit"].max()
    if best <= logits[ids].min():
        return None
    return int(short["id"][short["logit"] == best].min())


def redraw(c: Constraint, kept: np.ndarray, refused: int, rng: np.random.Generator) -> int | None:
    """After the chain drew `kept[refused]` and the grammar refused it: draws again from the
    chain's distribution (the candidates' `p`) until the grammar allows a token. Draws from p
    repeated until one lands in the allowed set A give each a in A p(a) / Z (Z: A's mass), the
    distribution masked, whatever came before. None when REDRAWS draws found none (Z is small)."""
    cum = np.cumsum(kept["p"], dtype=np.float64)
    if not cum[-1] > 0.0:
        return None
    picks = np.searchsorted(cum, rng.random(REDRAWS) * cum[-1], side="right")
    seen = {refused}
    for i in np.minimum(picks, len(cum) - 1).tolist():
        if i in seen:
            continue
        token = int(kept["id"][i])
        if c.allows(token):
            return token
        seen.add(i)
    return None


def check(vocab: Vocab | None, text: str) -> None:
    """Raise GrammarError if llama.cpp cannot compile `text` for this vocabulary (None: for no
    vocabulary)."""
    lc.llama_sampler_free(_compile(vocab, text))
