"""When a deploy or restart can take the comparison's baseline, and the comparison's plan in --dry-run
(opsctl/pipeline/compareplan.py): pure, over built hosts and snapshots."""

from __future__ import annotations

from dataclasses import replace

from opsctl.host.releaseroot import UnitInfo
from opsctl.inventory import HostConfig
from opsctl.pipeline import DeployOptions, make_plan
from opsctl.pipeline.compareplan import comparison_plan, skip_reason
from tests import builders
from tests.pipeline.test_plan import OLD, manifest, snap


def host(**gate_compare: object) -> HostConfig:
    return builders.host("tb1", gpu_arch=None, service={"mode": "standin"}, gate={"compare": gate_compare})


def test_a_running_ready_release_gives_a_baseline() -> None:
    assert skip_reason(host(), snap(), no_restart=False) is None
    lines = comparison_plan(host(), snap(), no_restart=False)
    assert lines[0].startswith("comparison workload: 2 warmup + 16 greedy request(s)")
    assert "fewer than 50% of the answers are identical over 32 tokens, decode is below 0.96x" in lines[1]
    assert lines[1].endswith("a FAIL rolls back (enforce: true)")
    assert lines[2] == f"comparison: baseline {OLD}, sampled before the switch if its server answers ready"


def test_each_reason_to_skip_the_baseline_is_named() -> None:
    assert skip_reason(host(enabled=False), snap(), no_restart=False) == (
        "the comparison is disabled (gate.compare.enabled: false)"
    )
    replay = builders.host("tb1", gpu_arch=None, service={"mode": "replay"})
    assert (
        skip_reason(replay, snap(), no_restart=False) == "the replay service serves no requests (service.mode: replay)"
    )
    assert skip_reason(host(), snap(), no_restart=True) == "--no-restart: nothing runs the new release to compare"
    assert skip_reason(host(), snap(current=None), no_restart=False) == "no release is running to compare with"
    down = replace(snap(), unit=UnitInfo(load_state="loaded", active_state="failed"))
    assert skip_reason(host(), down, no_restart=False) == "the unit is failed: no running release to compare with"


def test_the_dry_run_plan_lists_the_comparison_and_says_when_it_would_be_skipped() -> None:
    down = replace(snap(), unit=UnitInfo(load_state="loaded", active_state="inactive"))
    text = "\n".join(make_plan(host(enforce=False), manifest(), down, DeployOptions()).describe())
    assert "baseline: the comparison workload against" in text
    assert "comparison: the same workload against the new release, judged against the baseline" in text
    assert "reported only (enforce: false)" in text
    assert "the baseline would be skipped as the host stands now (the unit is inactive" in text
    staged = "\n".join(make_plan(host(), manifest(), snap(), DeployOptions(no_restart=True)).describe())
    assert "comparison" not in staged and "baseline" not in staged
    off = "\n".join(make_plan(host(enabled=False), manifest(), snap(), DeployOptions()).describe())
    assert "comparison: disabled (gate.compare.enabled: false)" in off and "baseline:" not in off
