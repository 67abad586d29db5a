"""The speculative-sampling acceptance rule (Leviathan et al. 2023; Chen et al. 2023).

A draft token d proposed with probability q(d) is accepted with probability min(1, p(d) / q(d)),
where p is the target's distribution at that position; on rejection the token is drawn from the
residual max(0, p − q), renormalized. The tokens emitted are then distributed exactly as p. When
every draft is accepted, one more (bonus) token is drawn from the target's next distribution.
The drafters here are deterministic (prompt lookup, history, a greedy draft model), so q is
one-hot at d: accept with probability p(d), else draw from p with d removed.
"""

from __future__ import annotations

import numpy as np


def accept_or_resample(p: np.ndarray, draft: int, rng: np.random.Generator,
                       q: np.ndarray | None = None) -> tuple[bool, int]:
    """(True, draft) when the draft is accepted, else (False, a token from the residual).

    `p` and `q` are probability vectors over the vocabulary; `q` None means one-hot at `draft`.
    """
    qd = 1.0 if q is None else float(q[draft])
    pd = float(p[draft])
    if qd > 0.0 and rng.random() * qd < pd:  # u < p/q without dividing
        return True, draft
    if q is None:
        residual = p.astype(np.float64, copy=True)
        residual[draft] = 0.0
    else:
        residual = np.maximum(p.astype(np.float64) - q, 0.0)
    total = residual.sum()
    if total <= 0.0:  # only when p == q up to rounding: the draft was right after all
        return True, draft
    return False, draw(residual / total, rng)


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """One token from the probability vector p (inverse CDF; p need not be exactly normalized)."""
    cdf = np.cumsum(p, dtype=np.float64)
    i = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(i, len(p) - 1)
