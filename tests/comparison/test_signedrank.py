"""opsctl's one-sided Wilcoxon signed-rank test (opsctl/comparison/signedrank.py) against scipy.stats.wilcoxon (a test
dependency only): the same W+ and p on random paired samples, exact and approximate, with and without ties."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import wilcoxon

from opsctl.comparison.mannwhitney import Method
from opsctl.comparison.signedrank import signed_rank_greater

SIZES = [1, 3, 8, 16, 24, 48, 60, 120]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("ties", [False, True])
def test_matches_scipy(n: int, ties: bool) -> None:
    rng = np.random.default_rng(n * 2 + ties)
    for _ in range(60):
        shift = rng.choice([0.0, 0.3, 1.0])
        d = np.round(rng.normal(shift, 1, n) * 2) / 2 if ties else rng.normal(shift, 1, n)
        if not np.any(d):
            continue
        ours = signed_rank_greater(d.tolist())
        exact = ours.method is Method.EXACT
        ref = wilcoxon(d, alternative="greater", zero_method="wilcox", method="exact" if exact else "approx",
                       correction=not exact)  # fmt: skip
        assert ours.w_plus == pytest.approx(float(ref.statistic))
        assert ours.p == pytest.approx(float(ref.pvalue), rel=1e-6, abs=1e-12), (n, ties, d)


def test_edges() -> None:
    assert signed_rank_greater([]).p == 1.0 and signed_rank_greater([0.0, 0.0]).n == 0
    all_up = signed_rank_greater([0.1 * i for i in range(1, 21)])
    assert all_up.p == pytest.approx(2.0**-20) and all_up.method is Method.EXACT
    assert signed_rank_greater([-0.1 * i for i in range(1, 21)]).p == pytest.approx(1.0)
    assert math.isclose(signed_rank_greater([1.0, -2.0]).p, 0.75)
