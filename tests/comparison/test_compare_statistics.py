"""The decode-speed judge's statistics (docs/gate.md "The statistics"), simulated with no I/O through the judge
itself (``compare`` and ``confirm``, as a deploy calls them), at the defaults, under the noise model of issue 48:
per prompt a log time of its own (prompts differ: accepted drafts), a whole side shifted by N(0, 2%), each request
N(0, 2%) apart from its pair. NumPy only draws the noise, seeded. The full tables (10,000 draws a row, the testbed's
measured noise, the unpaired judge of before beside it): scripts/simulate_compare_judge.py, docs/bench/compare-*."""

from __future__ import annotations

import math

import numpy as np

from opsctl.comparison.compare import compare, confirm, needs_another_sample
from opsctl.comparison.results import Outcome
from opsctl.comparison.sample import CompareRequest, ComparisonSample
from opsctl.inventory import CompareSettings

DEFAULTS = CompareSettings()
PROMPTS = 16


def sample(times: np.ndarray) -> ComparisonSample:
    return ComparisonSample(
        tuple(CompareRequest(output_ids=(i, 1), decode_s_per_token=float(t), ttft_s=0.1) for i, t in enumerate(times))
    )


def rates(seed: int, draws: int, slowdown: float, side: float = 0.02, paired: float = 0.02) -> tuple[float, float]:
    """(FAIL rate of a first sample, FAIL rate with the confirmation) over ``draws`` comparisons."""
    rng = np.random.default_rng(seed)
    first = confirmed = 0
    for _ in range(draws):
        prompt = rng.normal(0, 0.2, PROMPTS)

        def one(s: float, prompt: np.ndarray = prompt) -> ComparisonSample:
            noise = rng.normal(0, paired / math.sqrt(2), PROMPTS)
            return sample(0.02 * np.exp(prompt + rng.normal(0, side) + noise) / (1 - s))

        old, new, again = one(0.0), one(slowdown), one(slowdown)
        result = compare(old, new, DEFAULTS)
        first += result.outcome is Outcome.FAIL
        if needs_another_sample(result):
            result = confirm(result, compare(old, again, DEFAULTS))
        confirmed += result.outcome is Outcome.FAIL
    return first / draws, confirmed / draws


def test_same_release_false_fail_is_rare_and_rarer_confirmed() -> None:
    # docs/gate.md: 1.3% of first samples, 0.1-0.2% confirmed (10,000 draws). Here 4,000, with the bounds of issue 48.
    first, confirmed = rates(48, 4_000, 0.0)
    assert first <= 0.05 and confirmed <= 0.005, (first, confirmed)


def test_a_12_percent_slowdown_is_detected_95_percent_of_the_time_with_the_confirmation() -> None:
    first, confirmed = rates(49, 2_000, 0.12)
    assert confirmed >= 0.94 and first >= confirmed, (first, confirmed)  # 95.8% at 10,000 draws (docs/gate.md)


def test_a_20_percent_slowdown_is_detected_almost_always() -> None:
    _, confirmed = rates(50, 1_000, 0.20)
    assert confirmed >= 0.99
