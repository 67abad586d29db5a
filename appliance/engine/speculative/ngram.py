"""Prompt lookup: drafts from the request's own prompt and output.

The last n tokens of the sequence (n from the longest to the shortest of `sizes`) are looked up
among its earlier tokens; the tokens that followed their most recent earlier occurrence are the
draft. The index is incremental: each call adds the n-grams that gained a following token.
"""

from __future__ import annotations

NGRAM_SIZES = (5, 4, 3, 2)


NgramMaps = dict[int, dict[tuple[int, ...], int]]


def add_ngrams(maps: NgramMaps, tokens: list[int], lo: int, hi: int, offset: int = 0) -> None:
    """Index the n-grams of `tokens` ending at positions lo..hi-1: each maps to the position
    after it (+ offset), the later occurrence replacing the earlier."""
    for i in range(lo, hi):
        for n, table in maps.items():
            if i + 1 >= n:
                table[tuple(tokens[i + 1 - n : i + 1])] = offset + i + 1


def longest_match(maps: NgramMaps, tokens: list[int]) -> int | None:
    """Where the continuation of the longest indexed suffix of `tokens` starts, or None."""
    for n, table in maps.items():  # longest first
        if len(tokens) >= n:
            at = table.get(tuple(tokens[-n:]))
            if at is not None:
                return at
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
        if k <= 0 or len(tokens) < 2:
            return []
        # index only n-grams that have a following token, so the suffix never matches itself
        add_ngrams(self._maps, tokens, self._upto, len(tokens) - 1)
        self._upto = max(self._upto, len(tokens) - 1)
        at = longest_match(self._maps, tokens)
        return [] if at is None else tokens[at : at + k]
