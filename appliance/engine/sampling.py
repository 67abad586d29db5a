"""Per-sequence llama.cpp sampler chains built from request parameters."""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace

import llama_cpp as lc


@dataclass(frozen=True)
class ThinkBudget:
    """A reasoning budget: at most `tokens` generated tokens inside the think block, then the
    `close` tokens (the budget message and the closing tag) are forced (engine/reasoning.py)."""

    tokens: int
    close: tuple[int, ...]
    inside: bool  # the prompt opened the block: the answer starts inside it


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_last_n: int = 64
    seed: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)
    # A GBNF grammar (start symbol `root`) the output must follow (grammar.Constraint).
    grammar: str | None = None
    # With these tokens the grammar is lazy: the output is free until one of them is picked, and
    # from it on follows the grammar, which begins with that token (a model's tool-call tag).
    grammar_triggers: tuple[int, ...] = ()
    think_budget: ThinkBudget | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def stateless(self) -> bool:
        """No penalties: the chain keeps nothing of the tokens it is told were taken, so a draw
        can be discarded (a grammar's refusal) without telling it."""
        return self.repeat_penalty == 1.0 and self.presence_penalty == 0.0 and self.frequency_penalty == 0.0

    @property
    def plain_greedy(self) -> bool:
        """Greedy with nothing before the draw (no bias, no penalties): the chain's token is the
        logits' argmax, the first of equal maxima, as llama.cpp's greedy sampler takes it."""
        return self.greedy and not self.logit_bias and self.stateless


def with_seed_offset(params: SamplingParams, k: int) -> SamplingParams:
    """Params for the k-th of several samples of one request: seeded draws differ (seed + k)."""
    if k == 0 or params.seed is None:
        return params
    return replace(params, seed=(params.seed + k) & 0xFFFFFFFF)


def build_chain(params: SamplingParams, n_vocab: int, draw: bool = True) -> lc.llama_sampler_p:
    """A sampler chain in llama.cpp's usual order: bias, penalties, truncation, temperature, draw.

    `draw=False` (sampled params only) leaves the draw out: applied to a candidate array, the
    chain then yields the distribution the draw would use (speculative decoding's rejection rule).
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
        add(
            chain,
            lc.llama_sampler_init_penalties(
                n_vocab,
                params.penalty_last_n, params.repeat_penalty, params.frequency_penalty, params.presence_penalty
            ),
        )
    if params.greedy:
        add(chain, lc.llama_sampler_init_greedy())
        return chain
    if params.top_k > 0:
        add(chain, lc.llama_sampler_init_top_k(params.top_k))
    if params.top_p < 1.0:
        add(chain, lc.llama_sampler_init_top_p(params.top_p, 1))
    if params.min_p > 0.0:
        add(chain, lc.llama_sampler_init_min_p(params.min_p, 1))
    add(chain, lc.llama_sampler_init_temp(params.temperature))
    if not draw:
        return chain
    seed = params.seed if params.seed is not None else random.getrandbits(32)
    add(chain, lc.llama_sampler_init_dist(seed & 0xFFFFFFFF))
    return chain


def free_chain(chain: lc.llama_sampler_p) -> None:
    lc.llama_sampler_free(chain)
