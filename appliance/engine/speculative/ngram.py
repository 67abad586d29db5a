"""Prompt lookup: drafts from the request's own prompt and output.

The last n tokens of the sequence (n from the longest to the shortest of `sizes`) are looked up
among its earlier tokens; the tokens that followed their most recent earlier occurrence are the
draft. The index is incremental: each call adds the n-grams that gained a following token.
"""

from __future__ import annotations

NGRAM_SIZES = (5, 4, 3, 2)


class NgramIndex:
    """n-gram → position after its most recent occurrence, over one token list that only grows
    (or is cut back with `truncate`)."""

    __slots__ = ("sizes", "_maps", "_upto")

    def __init__(self, sizes: tuple[int, ...] = NGRAM_SIZES):
        self.sizes = tuple(sorted(sizes, reverse=True))
        self._maps: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self._upto = 0  # n-grams ending before this position are indexed

    def _extend(self, tokens: list[int], end: int) -> None:
        """Index every n-gram that ends before `end` (so each has a following token)."""
        for i in range(self._upto, end):
            for n in self.sizes:
                if i + 1 >= n:
                    self._maps[n][tuple(tokens[i + 1 - n : i + 1])] = i + 1
        self._upto = max(self._upto, end)

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        """Up to k tokens that followed the longest earlier match of the suffix of `tokens`."""
        if k <= 0 or len(tokens) < 2:
            return []
        self._extend(tokens, len(tokens) - 1)
        for n in self.sizes:
            if len(tokens) <= n:
                continue
            at = self._maps[n].get(tuple(tokens[-n:]))
            if at is not None:
                return tokens[at : at + k]
        return []
