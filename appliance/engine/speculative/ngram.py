"""Prompt lookup: drafts from the request's own prompt and output.

The last n tokens of the sequence (n from the longest to the shortest of `sizes`) are looked up
among its earlier tokens; the tokens that followed their most recent earlier occurrence are the
draft. The index is incremental: each call adds the n-grams that gained a following token.

A match p tokens back says the sequence repeats with period p, so where the tokens after it
run out (they reach the end of the sequence) the draft goes on with its own first tokens: a
greedy small model that has fallen into a loop (`-00-00-00`) gets drafts of any length, not
just one period.
"""

from __future__ import annotations

# Down to single tokens: a value copied from the prompt (a name, a code, an e-mail address) is
# often preceded by a token the prompt does not have before it (a quote instead of a space), so
# only its first token matches. Each n is a kind of its own with its own acceptance estimate, so
# the planner verifies 1-gram drafts only where they pay.
NGRAM_SIZES = (5, 4, 3, 2, 1)


NgramMaps = dict[int, dict[tuple[int, ...], int]]


def add_ngrams(maps: NgramMaps, tokens: list[int], lo: int, hi: int) -> None:
    """Index the n-grams of `tokens` ending at positions lo..hi-1: each maps to the position
    after it, the later occurrence replacing the earlier."""
    for i in range(lo, hi):
        for n, table in maps.items():
            if i + 1 >= n:
                table[tuple(tokens[i + 1 - n : i + 1])] = i + 1


def longest_match(maps: NgramMaps, tokens: list[int]) -> tuple[int, int] | None:
    """(where the continuation starts, n) for the longest indexed n-gram suffix of `tokens`, or None."""
    for n, table in maps.items():  # longest first
        if len(tokens) >= n:
            at = table.get(tuple(tokens[-n:]))
            if at is not None:
                return at, n
    return None


def new_maps(sizes: tuple[int, ...]) -> NgramMaps:
    return {n: {} for n in sorted(sizes, reverse=True)}


class NgramIndex:
    """Prompt lookup over one sequence's tokens, which only grow."""

    __slots__ = ("_maps", "_upto")

    def __init__(self, sizes: tuple[int, ...] = NGRAM_SIZES):
        self._maps = new_maps(sizes)
        self._upto = 0  # n-grams ending before this position are indexed

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the longest earlier match of the suffix of `tokens`."""
        return self.lookup_match(tokens, k)[0]

    def lookup_match(self, tokens: list[int], k: int) -> tuple[list[int], int]:
        """The draft (as `lookup`) and the length of the n-gram it matched (0: none)."""
        if k <= 0 or len(tokens) < 2:
            return [], 0
        # index only n-grams that have a following token, so the suffix never matches itself
        add_ngrams(self._maps, tokens, self._upto, len(tokens) - 1)
        self._upto = max(self._upto, len(tokens) - 1)
        hit = longest_match(self._maps, tokens)
        return ([], 0) if hit is None else (periodic_continuation(tokens, hit[0], k), hit[1])


def periodic_continuation(tokens: list[int], at: int, k: int) -> list[int]:
    """k tokens from tokens[at:], continued with period len(tokens) − at past the end."""
    draft = tokens[at : at + k]
    period = len(tokens) - at
    while len(draft) < k:
        draft.append(draft[len(draft) - period])
    return draft
