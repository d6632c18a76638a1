"""The comparison on real testbed hosts (docs/gate.md "The comparison"): the stand-in server decodes by tree
speculative decoding, so answers, decode speed and accepted drafts are measured as on SGLang. Two deploys and a
restart, kept few for CI: the same release again (A/A) passes, with every figure recorded, and so does a restart;
a release whose verify step takes 1.5x as long passes parity but fails the comparison and is rolled back."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsctl import pipeline as d
from opsctl.inventory import HostConfig, Inventory
from opsctl.release import make_manifest
from opsctl.testbed import variants
from tests.builders import comparing_at_1_and_8
from tests.pipeline import trees
from tests.pipeline.test_testbed_deploy import assert_healthy, ensure_good, fast, state

# They judge decode speed on the testbed: .ci/run runs them last, one at a time, on an otherwise idle machine
# (beside two other workers on 2 cores a 1.5x slower release was once measured within the pairs' noise).
pytestmark = pytest.mark.quiet

COMPARISON_BUDGET_S = 15.0  # what the comparison may add to a testbed deploy (issue 37)


@pytest.fixture
def tb2(testbed: Inventory) -> HostConfig:
    """tb2 with the pipeline tests' short gate, the comparison on (as the inventory has it)."""
    return comparing_at_1_and_8(fast(testbed.host("tb2")))


def test_the_same_release_again_compares_equal_and_is_recorded(tb2: HostConfig, good_tree: Path, good_id: str) -> None:
    ensure_good(tb2, good_tree, good_id)
    res = d.deploy(tb2, good_tree, d.DeployOptions(force=True))
    if res.verdict == "UNPROVEN":  # the testbed's noise withheld a slowdown (never a FAIL): once more, as an operator
        ensure_good(tb2, good_tree, good_id)
        res = d.deploy(tb2, good_tree, d.DeployOptions(force=True))
    assert res.verdict == "PASS", res.line()
    c = res.comparison
    # PASS, or "cannot decide" when other work on this shared machine took the CPU on one side: never a FAIL.
    assert c is not None and c["outcome"] in ("PASS", "UNDECIDED") and c["baseline_release"] == good_id, c
    # The default workload: 16 prompts at concurrency 1, then at 8, each level paired and judged (issue 48).
    assert c["line"].startswith(f"compared with {good_id} on 32 requests: 32/32 answers identical; decode "), c
    assert " at concurrency 1 (p=" in c["line"] and " at concurrency 8 (p=" in c["line"]
    result = c["result"]
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 8]
    assert all(lv["n_baseline"] == lv["n_candidate"] == 16 for lv in result["levels"])
    assert result["drafts"] is not None and result["drafts"]["baseline_mean"] > 1.0  # the stand-in accepts drafts
    assert result["load"]["baseline"] is not None  # the stand-in serves sglang:num_running_reqs
    _, history = state(tb2)
    assert history[-1].verdict == "PASS" and history[-1].comparison is not None
    assert history[-1].comparison["candidate"]["requests"][0]["output_ids"]
    added = res.step_times["baseline"] + res.step_times["comparison"]
    print(f"\n[measure] the comparison added {added:.1f}s to a {res.elapsed_s:.1f}s testbed deploy: {c['line']}")
    assert added <= COMPARISON_BUDGET_S, res.step_times
    # opsctl restart runs the same comparison: the release against itself.
    again = d.restart(tb2)
    if again.verdict == "UNPROVEN":  # CI: 0.92x at a spread of 0.19, and 0.79x with the host 1.28x busier: withheld
        assert again.comparison is not None and again.comparison["outcome"] == "UNPROVEN", again.line()
        again = d.restart(tb2)
    assert again.verdict == "PASS" and again.comparison is not None, again.line()
    assert again.comparison["outcome"] in ("PASS", "UNDECIDED") and again.comparison["baseline_release"] == good_id
    assert again.comparison["result"]["answers"]["identical"] == 32


def test_a_slower_release_passes_parity_and_fails_the_comparison(
    tb2: HostConfig, good_tree: Path, good_id: str, tmp_path: Path
) -> None:
    ensure_good(tb2, good_tree, good_id)
    slow = variants.slow(trees.SOURCE, tmp_path / "slow")
    slow_id = make_manifest(slow).id
    res = d.deploy(tb2, slow, d.DeployOptions())
    for _ in range(2):  # withheld (other work took this shared machine's CPU on one side): UNPROVEN, never a PASS
        if res.verdict != "UNPROVEN":
            break
        assert res.comparison is not None and res.comparison["outcome"] == "UNPROVEN", res.comparison
        ensure_good(tb2, good_tree, good_id)  # the baseline must be the good release again
        res = d.deploy(tb2, slow, d.DeployOptions())
    assert res.verdict == "FAIL" and res.stage == "comparison", (res.line(), (res.comparison or {}).get("line"))
    assert res.reason.startswith("comparison: decode 0.") and f"x of {good_id} at concurrency " in res.reason
    assert res.gate is not None and res.gate["verdict"] == "PASS"  # parity passed: only the comparison saw it
    assert res.rolled_back_to == good_id and res.rollback_verdict == "PASS"
    snap = assert_healthy(tb2, good_id)
    assert slow_id in snap.bad
    _, history = state(tb2)
    failed = next(r for r in reversed(history) if r.release == slow_id and r.event == "deploy")
    assert failed.stage == "comparison" and failed.comparison is not None
    assert failed.comparison["result"]["speed"]["outcome"] == "FAIL"
