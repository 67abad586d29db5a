"""Fanout answer selection: consensus, logprob, first; judge prompts and their parsing."""

from __future__ import annotations

import re
from collections import Counter
from difflib import SequenceMatcher

_NUMBER = re.compile(r"-?\d+(?:[.,]\d+)?")
_PUNCT = re.compile(r"[^\w\s-]")


def final_answer(text: str) -> str:
    """A normalised final answer: the last number if there is one, else the last non-empty line."""
    numbers = _NUMBER.findall(text)
    if numbers:
        return numbers[-1].replace(",", ".").rstrip("0").rstrip(".") if "." in numbers[-1] else numbers[-1]
    lines = [line for line in text.strip().splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    return " ".join(_PUNCT.sub(" ", last.lower()).split())


def similarity(a: str, b: str) -> float:
    """How alike two answers are, word by word (0..1): words, not characters, keep the quadratic
    matcher within reach on long answers."""
    return SequenceMatcher(None, a.split(), b.split(), autojunk=False).ratio()


def consensus(texts: list[str]) -> tuple[int, str]:
    """Index of the answer most members agree on, and why.

    A strict majority of normalised final answers wins; otherwise the medoid: the answer with
    the highest mean text similarity to the others.
    """
    if len(texts) == 1:
        return 0, "only one valid answer"
    answers = [final_answer(t) for t in texts]
    counts = Counter(a for a in answers if a)
    if counts:
        (best, n), *rest = counts.most_common()
        if n >= 2 and (not rest or rest[0][1] < n):
            return answers.index(best), f"majority: {n} of {len(texts)} answers agree on {best!r}"
    n = len(texts)
    totals = [0.0] * n
    for i in range(n):
        for j in range(i + 1, n):  # each pair once
            sim = similarity(texts[i], texts[j])
            totals[i] += sim
            totals[j] += sim
    means = [t / (n - 1) for t in totals]
    best_i = max(range(len(texts)), key=lambda i: (means[i], -i))
    return best_i, f"no majority; medoid by text similarity (mean similarity {means[best_i]:.2f})"


def by_logprob(logprobs: list[float | None]) -> tuple[int, str]:
    scored = [(lp, i) for i, lp in enumerate(logprobs) if lp is not None]
    if not scored:
        return 0, "no log-probabilities available; first valid answer"
    lp, i = max(scored, key=lambda x: (x[0], -x[1]))
    return i, f"highest mean token log-probability ({lp:.3f})"


def judge_prompt(question: str, answers: list[str]) -> list[dict[str, str]]:
    listing = "\n\n".join(f"Answer {i + 1}:\n{a.strip()}" for i, a in enumerate(answers))
    return [
        {
            "role": "user",
            "content": (
                f"Question:\n{question.strip()}\n\n{listing}\n\n"
                f"Which answer is best? Reply with the answer number only (1 to {len(answers)})."
            ),
        }
    ]


def parse_judgement(text: str, n: int) -> int | None:
    """The 0-based index the judge named, or None when it named no valid answer."""
    for m in re.finditer(r"\d+", text):
        k = int(m.group())
        if 1 <= k <= n:
            return k - 1
    return None
