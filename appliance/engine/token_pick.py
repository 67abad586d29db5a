"""The token a sequence takes at a row of the runner's last decode: its forced tokens first (a
reasoning budget's close), then under its grammar (grammar.py: the pick without it where the
grammar allows it, else the best or a redraw among the tokens it allows, the masked vocabulary
last), greedy, its own sampler chain, or, for a sampled sequence that speculates, a draw from
the chain's distribution by the rejection rule. And the log-probabilities of a row's tokens."""

from __future__ import annotations

import ctypes
import logging
from typing import TYPE_CHECKING

import llama_cpp as lc
import numpy as np

from . import held_gil
from .grammar import TOKEN_DATA, best_in_shortlist, redraw
from .native import LoadedModel, Vocab
from .speculative.rejection import accept_or_resample, draw

if TYPE_CHECKING:
    from .runner import _Sequence as Sequence

log = logging.getLogger("eie.runner")


class TokenPicker:
    """Picks for one runner's context (`loaded`: read at each pick, as a KV type change swaps
    its context), counting grammar masks and dead ends in the runner's `stats`. Used by the
    runner's step thread only."""

    def __init__(self, loaded: LoadedModel, vocab: Vocab, stats: dict[str, int], name: str):
        self._loaded = loaded
        self._vocab = vocab
        self._stats = stats
        self._name = name
        self._candidates: np.ndarray | None = None  # llama_token_data of a row, reused

    def pick(self, seq: Sequence, row: int, draft: int | None) -> tuple[int, bool]:
        """The target's token at a logits row, and whether it takes the draft proposed there."""
        if seq.forced:
            token = seq.forced.pop(0)
            self._accept_forced(seq, token)
            return token, token == draft
        if seq.grammar is not None and not self._grammar_waits(seq):
            token = self._constrained_pick(seq, row)
            return token, token == draft
        if seq.argmax:
            logits = np.ctypeslib.as_array(held_gil.get_logits_ith(self._loaded.ctx, row), shape=(self._loaded.n_vocab,))
            token = int(logits.argmax())
            return token, token == draft
        if seq.rng is None:  # the request's own chain (greedy, or sampling without speculation)
            token = held_gil.sampler_sample(seq.chain, self._loaded.ctx, row)
            return token, token == draft
        p = self._target_probs(seq, row)
        if draft is None:
            token, agreed = draw(p, seq.rng), False
        else:
            agreed, token = accept_or_resample(p, draft, seq.rng)
        held_gil.sampler_accept(seq.chain, token)
        return token, agreed

    @staticmethod
    def _grammar_waits(seq: Sequence) -> bool:
        """Whether the request's grammar sits out this token: inside a think block, a tool call's
        lazy grammar (its tag written there is thought, not a call), and any grammar where the
        prompt opened the block (structured output holds the answer after the thinking)."""
        think = seq.think
        return (think is not None and think.inside and seq.grammar is not None
                and (seq.grammar.waiting or think.opened_by_prompt))

    @staticmethod
    def _accept_forced(seq: Sequence, token: int) -> None:
        """Tell the chain (its penalties' history) of a token no pick chose. Forced tokens close a
        think block, which no grammar reads (_grammar_waits; a grammar that holds the block
        itself gets no budget)."""
        if seq.chain is not None:
            held_gil.sampler_accept(seq.chain, token)

    def _constrained_pick(self, seq: Sequence, row: int) -> int:
        """The token under the request's grammar: the pick without it when the grammar allows
        that token, else the same pick over the tokens it allows (grammar.py says how)."""
        grammar = seq.grammar
        if seq.argmax:
            logits = np.ctypeslib.as_array(held_gil.get_logits_ith(self._loaded.ctx, row), shape=(self._loaded.n_vocab,))
            token = int(logits.argmax())
            if not grammar.allows(token):
                found = best_in_shortlist(grammar, logits)
                token = found if found is not None else self._masked_pick(seq, row)
        else:
            stateless = seq.req.sampling.stateless
            if stateless:  # llama.cpp fills the candidates in C (numpy takes 0.95 ms for Gemma 3's 262k)
                token = held_gil.sampler_sample(seq.chain, self._loaded.ctx, row)
                if grammar.allows(token):
                    grammar.accept(token)
                    return token
            cand = self._fill_candidates(row)  # again: a second draw from the same distribution
            kept, selected = self._chain_apply(seq.chain, cand)
            token = int(kept["id"][selected])
            if not grammar.allows(token):
                if seq.req.sampling.greedy:  # bias and penalties changed the logits in place, in id order
                    found = best_in_shortlist(grammar, cand["logit"])
                else:
                    if seq.grammar_rng is None:
                        seq.grammar_rng = np.random.default_rng(seq.req.sampling.seed)
                    found = redraw(grammar, kept, selected, seq.grammar_rng)
                token = found if found is not None else self._masked_pick(seq, row)
            if not stateless:
                held_gil.sampler_accept(seq.chain, token)
        grammar.accept(token)
        return token

    def _masked_pick(self, seq: Sequence, row: int) -> int:
        """The pick over the whole vocabulary masked by the grammar (the slow way)."""
        self._stats["grammar_masks"] += 1
        cand = self._fill_candidates(row)
        if not seq.grammar.mask(cand):
            return self._dead_end(seq)
        if seq.argmax:
            return int(cand["logit"].argmax())
        kept, selected = self._chain_apply(seq.chain, cand)
        return int(kept["id"][selected])

    def _dead_end(self, seq: Sequence) -> int:
        """No token can continue the grammar (a grammar that needs text this vocabulary cannot
        spell): the answer ends here."""
        log.warning("model %s: sequence %d: the grammar allows no next token; ending the answer", self._name, seq.seq_id)
        self._stats["grammar_dead_ends"] += 1
        return self._vocab.eos

    @staticmethod
    def _chain_apply(chain: lc.llama_sampler_p, cand: np.ndarray) -> tuple[np.ndarray, int]:
        """Apply a sampler chain to candidates: the candidates it kept (truncation may shorten,
        sort or move them) and the index of the one drawn (-1 for a chain without a draw)."""
        arr = lc.llama_token_data_array(
            data=cand.ctypes.data_as(ctypes.POINTER(lc.llama_token_data)), size=len(cand), selected=-1, sorted=False)
        lc.llama_sampler_apply(chain, ctypes.byref(arr))
        kept = np.ctypeslib.as_array(ctypes.cast(arr.data, ctypes.POINTER(ctypes.c_uint8)),
                                     shape=(arr.size * TOKEN_DATA.itemsize,)).view(TOKEN_DATA)
        return kept, int(arr.selected)

    def _fill_candidates(self, row: int) -> np.ndarray:
        """The logits at `row` as llama_token_data, in the runner's reusable buffer."""
        n_vocab = self._loaded.n_vocab
        cand = self._candidates
        if cand is None:
            cand = self._candidates = np.zeros(n_vocab, dtype=TOKEN_DATA)
        cand["id"] = np.arange(n_vocab, dtype=np.int32)
        cand["logit"] = np.ctypeslib.as_array(held_gil.get_logits_ith(self._loaded.ctx, row), shape=(n_vocab,))
        cand["p"] = 0.0
        return cand

    def _target_probs(self, seq: Sequence, row: int) -> np.ndarray:
        """The distribution the request's sampler chain (bias, penalties, truncation,
        temperature) gives the logits at `row`: the `p` of the rejection rule."""
        kept, _ = self._chain_apply(seq.chain, self._fill_candidates(row))
        logits = kept["logit"].astype(np.float64)
        e = np.exp(logits - logits.max())
        p = np.zeros(self._loaded.n_vocab, dtype=np.float64)
        p[kept["id"]] = e / e.sum()
        return p

    def logprobs(self, index: int, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
        """log p(token) under the model's raw next-token distribution, and the k most likely."""
        ptr = held_gil.get_logits_ith(self._loaded.ctx, index)
        logits = np.ctypeslib.as_array(ptr, shape=(self._loaded.n_vocab,))
        top = float(logits.max())
        lse = top + float(np.log(np.exp(logits - top, dtype=np.float64).sum()))
        best: list[tuple[int, float]] = []
        if k == 1:  # argmax: a tenth of argpartition's time over Gemma 3's 262k logits
            best = [(int(i), float(logits[i]) - lse) for i in (logits.argmax(),)]
        elif k > 1:
            ids = np.argpartition(logits, -k)[-k:]
            ids = ids[np.argsort(-logits[ids], kind="stable")]
            best = [(int(i), float(logits[i]) - lse) for i in ids]
        return float(logits[token]) - lse, best
