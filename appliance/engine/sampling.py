"""Per-sequence llama.cpp sampler chains built from request parameters."""

from __future__ import annotations

import ctypes
import hashlib
import random
from dataclasses import dataclass, field, replace

import llama_cpp as lc


@dataclass(frozen=True)
class ThinkBudget:
    """A reasoning budget: at most `tokens` generated tokens inside the think block, then the
    `close` tokens (the budget message and the closing tag) are forced (engine/reasoning.py);
    -1: no bound, the block's tokens only counted."""

    tokens: int
    close: tuple[int, ...]
    inside: bool  # the prompt opened the block: the answer starts inside it
    open_tag: str = "<think>"  # the block's tags, as the answer's text writes them
    close_tag: str = "</think>"


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64  # -1: the context
    # llama-server's further samplers, in its order after the penalties: DRY (a penalty on tokens
    # that would extend a repeated sequence), top-n-sigma, top-k, typical, top-p, min-p, XTC
    # (drops the likeliest tokens but one, with a probability), temperature (dynamic with a
    # range); mirostat (1 or 2) replaces the truncations and the draw.
    dry_multiplier: float = 0.0
    dry_base: float = 1.75
    dry_allowed_length: int = 2
    dry_penalty_last_n: int = -1  # -1: the context
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", "\"", "*")
    top_n_sigma: float = -1.0  # <= 0: off
    typical_p: float = 1.0
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1
    dynatemp_range: float = 0.0
    dynatemp_exponent: float = 1.0
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    seed: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    # A GBNF grammar (start symbol `root`) the output must follow (grammar.Constraint).
    grammar: str | None = None
    # With these tokens (ids) or texts the grammar is lazy: the output is free until one of them
    # is written, and from it on follows the grammar, which begins with it (a model's tool-call tag).
    grammar_triggers: tuple[int | str, ...] = ()
    # Tokens written out in the answer's text although they are control tokens (a tool format's
    # tags, which the answer is read back by).
    shown_tokens: tuple[int, ...] = ()
    think_budget: ThinkBudget | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def stateless(self) -> bool:
        """No penalties, DRY or mirostat: the chain keeps nothing of the tokens it is told were
        taken or drawn, so a draw can be discarded (a grammar's refusal) without telling it."""
        return (self.repeat_penalty == 1.0 and self.presence_penalty == 0.0 and self.frequency_penalty == 0.0
                and self.dry_multiplier == 0.0 and self.mirostat == 0)

    @property
    def draws_itself(self) -> bool:
        """Mirostat picks the token inside its own step: there is no distribution to hand to
        speculative decoding's rejection rule, so drafts are sampled and compared instead."""
        return self.mirostat != 0 and not self.greedy

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing before the draw (no bias, no penalties): the chain's token is the
        logits' argmax, the first of equal maxima, as llama.cpp's greedy sampler takes it."""
        return self.greedy and not self.logit_bias and self.stateless


RANDOM_SEED = 0xFFFFFFFF  # llama.cpp's LLAMA_DEFAULT_SEED: "draw a random seed"


def seed32(seed: int, k: int = 0) -> int:
    """A request's seed (any integer; `k`: its k-th sample) as llama.cpp's 32-bit one, never
    RANDOM_SEED: a seed of 0..2^32-2 is itself (as llama-server takes it), any other one, and every
    later sample's, a hash of it, so that no two requests' samples share a seed by arithmetic."""
    if k == 0 and 0 <= seed < RANDOM_SEED:
        return seed
    digest = hashlib.blake2b(seed.to_bytes(16, "little", signed=True) + k.to_bytes(4, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little") % RANDOM_SEED


def with_seed_offset(params: SamplingParams, k: int) -> SamplingParams:
    """Params for the k-th of several samples of one request: seeded draws differ (seed32)."""
    if k == 0 or params.seed is None:
        return params
    return replace(params, seed=seed32(params.seed, k))


def build_chain(params: SamplingParams, vocab: lc.llama_vocab_p, n_vocab: int, n_ctx: int,
                draw: bool = True) -> lc.llama_sampler_p:
    """A sampler chain in llama-server's order: bias, penalties, DRY, truncations, temperature,
    draw (mirostat: temperature, then mirostat's own draw). -1 for a `last_n` is the context.

    `draw=False` (sampled params without mirostat) leaves the draw out: applied to a candidate
    array, the chain then yields the distribution the draw would use (speculative decoding's
    rejection rule).
    """
    chain = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    add = lc.llama_sampler_chain_add
    if params.logit_bias:
        items = list(params.logit_bias.items())
        arr = (lc.llama_logit_bias * len(items))()
        for i, (tok, bias) in enumerate(items):
            arr[i].token = tok
            arr[i].bias = bias
        add(chain, lc.llama_sampler_init_logit_bias(n_vocab, len(items), arr))
    if params.repeat_penalty != 1.0 or params.presence_penalty != 0.0 or params.frequency_penalty != 0.0:
        last_n = n_ctx if params.penalty_last_n < 0 else params.penalty_last_n
        add(chain, lc.llama_sampler_init_penalties(n_vocab, last_n, params.repeat_penalty, params.frequency_penalty,
                                                    params.presence_penalty))
    if params.dry_multiplier > 0.0:
        breakers = [b.encode() for b in params.dry_sequence_breakers]
        arr = (ctypes.c_char_p * max(1, len(breakers)))(*breakers)
        last_n = n_ctx if params.dry_penalty_last_n < 0 else params.dry_penalty_last_n
        add(chain, lc.llama_sampler_init_dry(vocab, params.dry_multiplier, params.dry_base, params.dry_allowed_length,
                                             last_n, arr, len(breakers)))
    seed = params.seed if params.seed is not None else random.randrange(RANDOM_SEED)
    if params.greedy:
        add(chain, lc.llama_sampler_init_greedy())
        return chain
    if params.mirostat:
        add(chain, lc.llama_sampler_init_temp(params.temperature))
        if params.mirostat == 1:
            add(chain, lc.llama_sampler_init_mirostat(n_vocab, seed, params.mirostat_tau, params.mirostat_eta, 100))
        else:
            add(chain, lc.llama_sampler_init_mirostat_v2(seed, params.mirostat_tau, params.mirostat_eta))
        return chain
    if params.top_n_sigma > 0.0:
        add(chain, lc.llama_sampler_init_top_n_sigma(params.top_n_sigma))
    if params.top_k > 0:
        add(chain, lc.llama_sampler_init_top_k(params.top_k))
    if params.typical_p < 1.0:
        add(chain, lc.llama_sampler_init_typical(params.typical_p, 1))
    if params.top_p < 1.0:
        add(chain, lc.llama_sampler_init_top_p(params.top_p, 1))
    if params.min_p > 0.0:
        add(chain, lc.llama_sampler_init_min_p(params.min_p, 1))
    if params.xtc_probability > 0.0:
        add(chain, lc.llama_sampler_init_xtc(params.xtc_probability, params.xtc_threshold, 1, seed))
    if params.dynatemp_range > 0.0:
        add(chain, lc.llama_sampler_init_temp_ext(params.temperature, params.dynatemp_range, params.dynatemp_exponent))
    else:
        add(chain, lc.llama_sampler_init_temp(params.temperature))
    if not draw:
        return chain
    add(chain, lc.llama_sampler_init_dist(seed))
    return chain


def free_chain(chain: lc.llama_sampler_p) -> None:
    lc.llama_sampler_free(chain)
