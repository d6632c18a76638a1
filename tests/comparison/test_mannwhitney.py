"""opsctl's own one-sided Mann-Whitney U test (opsctl/comparison/mannwhitney.py) against scipy.stats.mannwhitneyu (a test
dependency only): the same U and p on thousands of random samples, both methods, with and without ties. SciPy
judges each batch of samples of one pair of sizes in one vectorised call."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import mannwhitneyu

from opsctl.comparison.mannwhitney import EXACT_MAX_CELLS, Method, mann_whitney_greater, midranks, smallest_p

# Pairs of sizes: the comparison's own (16 vs 16, and what is left when a few requests fail), small and lopsided.
SIZES = [(16, 16), (15, 16), (16, 12), (8, 8), (5, 5), (1, 7), (3, 20), (24, 24), (31, 32), (10, 3)]
PER_SIZE = 300  # 3,000 samples per method


def _batches(seed: int, ties: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for n1, n2 in SIZES:
        shift = rng.choice([0.0, 0.5, 1.5], size=(PER_SIZE, 1))
        if ties:
            x = rng.integers(0, 6, size=(PER_SIZE, n1)) + np.round(shift)
            y = rng.integers(0, 6, size=(PER_SIZE, n2)).astype(float)
        else:
            x = rng.normal(shift, 1, size=(PER_SIZE, n1))
            y = rng.lognormal(0, 1, size=(PER_SIZE, n2))
        out.append((x.astype(float), y))
    return out


@pytest.mark.parametrize("method", [Method.EXACT, Method.ASYMPTOTIC])
def test_agrees_with_scipy_without_ties(method: Method) -> None:
    for x, y in _batches(1, ties=False):
        theirs = mannwhitneyu(x, y, alternative="greater", method=str(method), axis=1)
        for i in range(len(x)):
            ours = mann_whitney_greater(x[i].tolist(), y[i].tolist(), method)
            assert ours.u == pytest.approx(theirs.statistic[i], abs=1e-9)
            assert ours.p == pytest.approx(theirs.pvalue[i], rel=1e-9, abs=1e-12), (x[i], y[i])


def test_agrees_with_scipy_with_ties() -> None:
    for x, y in _batches(2, ties=True):
        theirs = mannwhitneyu(x, y, alternative="greater", method="asymptotic", axis=1)
        for i in range(len(x)):
            ours = mann_whitney_greater(x[i].tolist(), y[i].tolist(), Method.ASYMPTOTIC)
            assert ours.u == pytest.approx(theirs.statistic[i], abs=1e-9)
            if math.isnan(theirs.pvalue[i]):  # every value tied: SciPy has no p; no spread is no evidence
                assert ours.p == 1.0
            else:
                assert ours.p == pytest.approx(theirs.pvalue[i], rel=1e-9, abs=1e-12), (x[i], y[i])


def test_auto_is_exact_without_ties_at_the_comparisons_sizes_else_asymptotic() -> None:
    rng = np.random.default_rng(4)
    x, y = rng.random(16).tolist(), rng.random(16).tolist()
    assert mann_whitney_greater(x, y).method is Method.EXACT
    assert mann_whitney_greater([*x[:-1], x[0]], y).method is Method.ASYMPTOTIC  # a tie
    big = rng.random(EXACT_MAX_CELLS // 16 + 1).tolist()
    assert mann_whitney_greater(big, y).method is Method.ASYMPTOTIC


def test_complete_separation_gives_the_smallest_p() -> None:
    assert mann_whitney_greater([10, 11, 12, 13, 14], [1, 2, 3, 4, 5]).p == pytest.approx(1 / 252)
    assert smallest_p(5, 5) == pytest.approx(1 / 252) and smallest_p(4, 4) == pytest.approx(1 / 70)


def test_midranks_average_ties() -> None:
    assert midranks([3.0, 1.0, 3.0, 2.0]) == ([3.5, 1.0, 3.5, 2.0], 6.0)


def test_refuses_empty_or_non_finite_samples() -> None:
    with pytest.raises(ValueError, match="at least one"):
        mann_whitney_greater([], [1.0])
    with pytest.raises(ValueError, match="finite"):
        mann_whitney_greater([math.nan], [1.0])
