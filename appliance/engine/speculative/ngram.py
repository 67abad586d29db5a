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
# A match found with the longest n-gram is followed backwards up to this many tokens: how far it
# goes says much about how far the draft will (SmolLM2's JSON answers in the bench: a draft after a
# 5-7 token match ran 2.6-4.7 tokens on average, one after a 16+ token match 14.6), and the planner
# keeps an acceptance estimate per class of length (`match_class`).
MATCH_CAP = 16


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


def match_length(source: list[int], at: int, tokens: list[int], n: int, cap: int = MATCH_CAP) -> int:
    """How many tokens before source[at] equal the end of `tokens`, given that the last n do, up to
    `cap` (a negative token in `source` ends it: a separator)."""
    length = n
    while length < cap and at - length - 1 >= 0 and length < len(tokens):
        t = source[at - length - 1]
        if t < 0 or t != tokens[-length - 1]:
            break
        length += 1
    return length


def match_class(length: int) -> int:
    """The acceptance class of a match of `length` tokens: 1-4 as they are, then 5 (5-7), 8 (8-15), 16."""
    return length if length < 5 else 5 if length < 8 else 8 if length < 16 else 16


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
        """The draft (as `lookup`) and the length of the match it continues (`match_length`;
        0: none)."""
        if k <= 0 or len(tokens) < 2:
            return [], 0
        # index only n-grams that have a following token, so the suffix never matches itself
        add_ngrams(self._maps, tokens, self._upto, len(tokens) - 1)
        self._upto = max(self._upto, len(tokens) - 1)
        hit = longest_match(self._maps, tokens)
        if hit is None:
            return [], 0
        at, n = hit
        return periodic_continuation(tokens, at, k), match_length(tokens, at, tokens, n)


def periodic_continuation(tokens: list[int], at: int, k: int) -> list[int]:
    """k tokens from tokens[at:], continued with period len(tokens) − at past the end."""
    draft = tokens[at : at + k]
    period = len(tokens) - at
    while len(draft) < k:
        draft.append(draft[len(draft) - period])
    return draft


class PredictionIndex:
    """A request's predicted answer (OpenAI's `prediction`, e.g. the file a code edit rewrites)
    and where each of its n-grams stands: built once, off the runner's thread, and shared by the
    request's sequences (each follows it with a `PredictionLookup` of its own)."""

    __slots__ = ("tokens", "places")

    def __init__(self, tokens: list[int], sizes: tuple[int, ...] = NGRAM_SIZES):
        self.tokens = tokens
        self.places: dict[int, dict[tuple[int, ...], list[int]]] = {n: {} for n in sorted(sizes, reverse=True)}
        for i in range(len(tokens) - 1):  # n-grams with a following token
            for n, table in self.places.items():
                if i + 1 >= n:
                    table.setdefault(tuple(tokens[i + 1 - n : i + 1]), []).append(i + 1)


class PredictionLookup:
    """Drafts from a predicted answer: the end of the answer so far is looked up in the prediction
    (n-grams, longest first; of several occurrences the first at or after the previous match), and
    the prediction's tokens after it are the draft. Before the answer has a token the draft is the
    prediction's beginning."""

    __slots__ = ("index", "_cursor")

    def __init__(self, index: PredictionIndex):
        self.index = index
        self._cursor = 0

    def lookup(self, answer: list[int], k: int) -> tuple[list[int], int]:
        """Up to k predicted tokens to follow `answer` (the tokens generated so far), and the
        length of the match they continue (MATCH_CAP at the start; 0: none)."""
        predicted = self.index.tokens
        if k <= 0:
            return [], 0
        if not answer:
            return predicted[:k], MATCH_CAP
        for n, table in self.index.places.items():
            if len(answer) >= n:
                places = table.get(tuple(answer[-n:]))
                if places:
                    at = next((p for p in places if p >= self._cursor), places[0])
                    self._cursor = at
                    return predicted[at : at + k], match_length(predicted, at, answer, n)
        return [], 0
