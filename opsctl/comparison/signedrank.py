"""The one-sided Wilcoxon signed-rank test, in plain Python, for paired samples: the pre-restart speed check (the
new and the running release timed on the same calls) and the comparison (the same prompt on both releases).

Why not SciPy: as for :mod:`opsctl.comparison.mannwhitney` (start-up time of the offline commands, a 40 MB install).
``tests/comparison/test_signedrank.py`` checks this module against ``scipy.stats.wilcoxon`` (a test dependency only).

Differences ``d`` (new minus old, e.g. log time ratios); zeros are dropped (SciPy's ``zero_method="wilcox"``); the
rest are ranked by ``|d|`` with ties given their mean rank. ``W+`` is the sum of the ranks of the positive
differences; the one-sided p-value is that of "the differences tend to be positive" (the new release slower).
**Exact** null distribution when there are no ties and at most :data:`EXACT_MAX_N` differences (SciPy's
``method="exact"``); otherwise the **normal approximation** with the tie correction and a continuity correction of
0.5 (SciPy's ``method="approx", correction=True``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from .mannwhitney import Method, midranks

EXACT_MAX_N = 50  # 2^50 sign patterns, counted by W in O(n^3) once per n


@dataclass(frozen=True)
class SignedRank:
    """``w_plus``: the sum of the ranks of the positive differences; ``n``: differences that are not zero;
    ``p``: the one-sided p-value of "the differences tend to be positive" (1.0 when ``n`` is 0)."""

    w_plus: float
    n: int
    p: float
    method: Method


@lru_cache(maxsize=64)
def _null_counts(n: int) -> tuple[int, ...]:
    """How many of the 2^n sign patterns of ranks 1..n give each W+ = 0 .. n(n+1)/2."""
    counts = [1]
    for rank in range(1, n + 1):
        grown = counts + [0] * rank
        for w, c in enumerate(counts):
            grown[w + rank] += c
        counts = grown
    return tuple(counts)


def signed_rank_greater(diffs: Sequence[float], method: Method = Method.AUTO) -> SignedRank:
    """Wilcoxon's signed-rank test of "``diffs`` tend to be positive" (one-sided)."""
    nonzero = [d for d in diffs if d != 0 and not math.isnan(d)]
    n = len(nonzero)
    if n == 0:
        return SignedRank(0.0, 0, 1.0, Method.EXACT)
    ranks, tie_term = midranks([abs(d) for d in nonzero])
    w_plus = sum(r for r, d in zip(ranks, nonzero, strict=True) if d > 0)
    exact = method is Method.EXACT or (method is Method.AUTO and tie_term == 0 and n <= EXACT_MAX_N)
    if exact:
        counts = _null_counts(n)
        at_least = sum(counts[math.ceil(w_plus - 1e-9) :])
        return SignedRank(w_plus, n, min(1.0, at_least / 2.0**n), Method.EXACT)
    mean = n * (n + 1) / 4
    var = n * (n + 1) * (2 * n + 1) / 24 - tie_term / 48
    if var <= 0:
        return SignedRank(w_plus, n, 1.0 if w_plus <= mean else 0.0, Method.ASYMPTOTIC)
    z = (w_plus - mean - 0.5) / math.sqrt(var)
    return SignedRank(w_plus, n, min(1.0, 0.5 * math.erfc(z / math.sqrt(2))), Method.ASYMPTOTIC)
