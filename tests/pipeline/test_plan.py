from dataclasses import replace

import pytest

from opsctl.errors import DeployFailed
from opsctl.host.history import DeployVerdict, HistoryEvent, HistoryRecord
from opsctl.host.releaseroot import HostSnapshot, UnitInfo
from opsctl.inventory import HostConfig
from opsctl.pipeline import DeployOptions, make_plan, rollback_target
from opsctl.pipeline.plan import last_verdict, redeploy_reason
from opsctl.release import FileEntry, Manifest
from tests import builders

NEW = "r00000000000d"
OLD = "r00000000000b"
INV = "0123456789abcdef0123456789abcdef"  # the unit's running invocation, which the PASS records below gated


def host(gpu: str | None = None) -> HostConfig:
    return builders.host("tb1", gpu_arch=gpu, root="/srv/k", min_free_disk_mb=100, service={"mode": "replay"})


def manifest(rid: str = NEW) -> Manifest:
    return Manifest(
        id=rid,
        files=(FileEntry("kernel/a.py", "0" * 64, 1, False),),
        commit=None,
        dirty=False,
        created_by="t",
        created_at="t",
        opsctl_version="0",
    )


def snap(**kw: object) -> HostSnapshot:
    base = HostSnapshot(
        root_exists=True,
        managed={"adopted": False},
        current=OLD,
        releases={OLD: 1.0, "r00000000000a": 0.5},
        bad=frozenset(),
        last_good=OLD,
        lock_owner=None,
        lock_present=False,
        free_mb=5000,
        unit=UnitInfo(load_state="loaded", active_state="active", invocation_id=INV),
        gpu_compute_caps=(),
        now=0.0,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def test_normal_plan() -> None:
    p = make_plan(host(), manifest(), snap(), DeployOptions())
    assert p.refusal is None and not p.up_to_date
    assert p.link_dest == f"/srv/k/releases/{OLD}"
    text = "\n".join(p.describe())
    assert "pre-restart parity" in text and "gate:" in text and f"roll back to {OLD}" in text


def test_no_restart_and_skip_parity_plan() -> None:
    p = make_plan(host(), manifest(), snap(), DeployOptions(no_restart=True, skip_prerestart_parity=True))
    text = "\n".join(p.describe())
    assert "restart" not in text.replace("pre-restart", "") and "pre-restart parity" not in text


@pytest.mark.parametrize(
    "kw,word",
    [
        ({"managed": None}, "adopt"),
        (
            {
                "lock_present": True,
                "lock_owner": {"user": "bob", "client": "c", "pid": 1, "since": "t", "command": "deploy"},
            },
            "bob@c",
        ),
        ({"free_mb": 10}, "MB free"),
        ({"bad": frozenset({NEW})}, "marked bad"),
    ],
)
def test_refusals(kw: dict[str, object], word: str) -> None:
    p = make_plan(host(), manifest(), snap(**kw), DeployOptions())
    assert p.refusal and word in p.refusal


def test_virgin_host_is_deployable() -> None:
    s = snap(managed=None, root_exists=False, unit=UnitInfo(), current=None, releases={}, last_good=None)
    p = make_plan(host(), manifest(), s, DeployOptions())
    assert p.refusal is None and p.link_dest is None and any("virgin" in n for n in p.notes)


def test_gpu_arch_must_match() -> None:
    assert make_plan(host("12.0"), manifest(), snap(gpu_compute_caps=("9.0",)), DeployOptions()).refusal
    assert make_plan(host("12.0"), manifest(), snap(gpu_compute_caps=("12.0",)), DeployOptions()).refusal is None


PASSED = (HistoryRecord(HistoryEvent.DEPLOY, OLD, DeployVerdict.PASS, invocation=INV),)


def test_bad_release_with_force_and_up_to_date() -> None:
    assert make_plan(host(), manifest(), snap(bad=frozenset({NEW})), DeployOptions(force=True)).refusal is None
    assert make_plan(host(), manifest(OLD), snap(), DeployOptions(), PASSED).up_to_date
    assert not make_plan(host(), manifest(OLD), snap(), DeployOptions(force=True), PASSED).up_to_date


def test_up_to_date_needs_current_a_passed_gate_and_an_active_unit() -> None:
    assert redeploy_reason(OLD, snap(), PASSED) is None
    # Each of the three missing on its own means: deploy again.
    assert "current is r00000000000a" in (redeploy_reason(OLD, snap(current="r00000000000a"), PASSED) or "")
    assert "current is none" in (redeploy_reason(OLD, snap(current=None), PASSED) or "")
    assert "no gated verdict" in (redeploy_reason(OLD, snap(), ()) or "")
    dead = snap(unit=UnitInfo(load_state="loaded", active_state="inactive"))
    assert "unit is inactive" in (redeploy_reason(OLD, dead, PASSED) or "")
    failed = snap(unit=UnitInfo(load_state="loaded", active_state="failed"))
    assert "unit is failed" in (redeploy_reason(OLD, failed, PASSED) or "")


@pytest.mark.parametrize(
    "latest",
    [
        # issue 36: a first deploy that ended UNPROVEN leaves `current` on it (and the unit stopped)
        HistoryRecord(HistoryEvent.DEPLOY, OLD, DeployVerdict.UNPROVEN, current=OLD),
        HistoryRecord(HistoryEvent.DEPLOY, OLD, DeployVerdict.STAGED),  # --no-restart: never gated
        HistoryRecord(HistoryEvent.RESTART, OLD, DeployVerdict.FAIL),  # a plain restart failed its gate
        HistoryRecord(HistoryEvent.ROLLBACK, OLD, DeployVerdict.DONE),  # an ungated rollback
        HistoryRecord(HistoryEvent.DEPLOY, OLD, DeployVerdict.ERROR),
    ],
)
def test_a_later_verdict_other_than_pass_is_not_up_to_date(latest: HistoryRecord) -> None:
    history = [*PASSED, HistoryRecord(HistoryEvent.DEPLOY_START, OLD), latest]
    assert last_verdict(history, OLD) is latest.verdict
    plan = make_plan(host(), manifest(OLD), snap(), DeployOptions(), history)
    assert not plan.up_to_date and plan.refusal is None
    assert any("last gate did not pass" in n and str(latest.verdict) in n for n in plan.notes)


def test_last_verdict_is_the_releases_own_and_gated() -> None:
    history = [
        *PASSED,
        HistoryRecord(HistoryEvent.DEPLOY, NEW, DeployVerdict.FAIL, current=OLD),  # another release's failure
        HistoryRecord(HistoryEvent.DEPLOY_START, OLD),  # no verdict
        HistoryRecord(HistoryEvent.LOCK_BREAK),
    ]
    assert last_verdict(history, OLD) is DeployVerdict.PASS
    assert make_plan(host(), manifest(OLD), snap(), DeployOptions(), history).up_to_date
    # A rollback that passed its gate vouches for the release it went back to.
    back = [
        HistoryRecord(HistoryEvent.DEPLOY, OLD, DeployVerdict.UNPROVEN),
        HistoryRecord(HistoryEvent.ROLLBACK, OLD, DeployVerdict.PASS, invocation=INV),
    ]
    assert redeploy_reason(OLD, snap(), back) is None


def test_rollback_target() -> None:
    history = [
        HistoryRecord(HistoryEvent.DEPLOY, "r00000000000a", DeployVerdict.PASS),
        HistoryRecord(HistoryEvent.DEPLOY, OLD, DeployVerdict.PASS),
    ]
    s = snap(current=OLD, last_good=OLD)
    assert rollback_target(s, None, False, history) == "r00000000000a"
    with pytest.raises(DeployFailed, match="nothing to roll back to"):
        rollback_target(s, None, False, history[1:])
    with pytest.raises(DeployFailed, match="marked bad"):
        rollback_target(snap(bad=frozenset({"r00000000000a"})), "r00000000000a", False, history)
    assert rollback_target(snap(bad=frozenset({"r00000000000a"})), "r00000000000a", True, history) == "r00000000000a"
    with pytest.raises(DeployFailed, match="not on the host"):
        rollback_target(s, "r00000000000f", False, history)
    # A bad release is never the automatic choice.
    with pytest.raises(DeployFailed):
        rollback_target(snap(bad=frozenset({"r00000000000a"})), None, False, history)
