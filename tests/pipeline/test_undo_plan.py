"""Issue 47 items 2, 6, 7 and 8 as pure decisions (and the release root's marks on a real local shell): where a failed
deploy goes back to, when a current release is up to date, and that a release is never last good and bad at once.
The same cases on testbed hosts: tests/pipeline/test_failclosed4_undo_testbed.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from opsctl.host import releaseroot
from opsctl.host.history import DeployVerdict, HistoryEvent, HistoryRecord
from opsctl.host.releaseroot import HostSnapshot, UnitInfo, reconciled_last_good
from opsctl.pipeline.plan import redeploy_reason
from opsctl.pipeline.result import DeployResult, NoRollback
from opsctl.pipeline.rollback import UndoKind, UndoPlan, good_releases, undo_plan
from tests.pipeline.localremote import LocalRemote

A, B, C = "r00000000000a", "r00000000000b", "r00000000000c"
INV = "11111111111111111111111111111111"
ACTIVE = UnitInfo(load_state="loaded", active_state="active", invocation_id=INV)
DEAD = UnitInfo(load_state="loaded", active_state="inactive")


def snap(**kw: object) -> HostSnapshot:
    base = HostSnapshot(
        root_exists=True,
        managed={"adopted": False},
        current=B,
        releases={A: 1.0, B: 2.0, C: 3.0},
        bad=frozenset(),
        last_good=B,
        lock_owner=None,
        lock_present=False,
        free_mb=5000,
        unit=ACTIVE,
        gpu_compute_caps=(),
        now=0.0,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def passed(release: str, invocation: str | None = None) -> HistoryRecord:
    return HistoryRecord(HistoryEvent.DEPLOY, release, DeployVerdict.PASS, invocation=invocation)


# ------------------------------------------------------------------------------------------------ undo_plan (item 2, 8)


def test_a_new_release_rejected_goes_back_to_the_previous_one() -> None:
    assert undo_plan(snap(), [passed(B)], C) == UndoPlan(UndoKind.ROLLBACK, B)


def test_a_forced_redeploy_of_current_goes_to_another_good_release() -> None:
    """The failed release is current and last good, but an older release passed a gate: that one, gated."""
    assert undo_plan(snap(), [passed(A), passed(B)], B) == UndoPlan(UndoKind.ROLLBACK, A)


@pytest.mark.parametrize("state", ["active", "activating", "reloading"])
def test_the_only_good_release_failing_restarts_what_served_before(state: str) -> None:
    """A forced redeploy of the only good release (stricter thresholds, a changed service.tp): no other good release,
    the unit was serving: what served before, as it served, never a stopped unit."""
    serving = snap(unit=replace(ACTIVE, active_state=state))
    assert undo_plan(serving, [passed(B)], B) == UndoPlan(UndoKind.AS_BEFORE, B)


def test_a_bad_previous_release_that_was_serving_is_restarted_as_before() -> None:
    s = snap(bad=frozenset({B}), last_good=None)
    assert undo_plan(s, [passed(B)], C) == UndoPlan(UndoKind.AS_BEFORE, B)


def test_the_failed_release_and_bad_releases_are_never_targets() -> None:
    s = snap(bad=frozenset({A}), unit=DEAD)
    assert undo_plan(s, [passed(A), passed(B)], B) == UndoPlan(UndoKind.STOP)
    assert good_releases(s, [passed(A), passed(B), passed(C)], B) == [C]


def test_nothing_good_and_nothing_serving_stops() -> None:
    """A first deploy (no current, nothing served): stopped and disabled, current removed by the undo (item 8)."""
    first = snap(current=None, releases={C: 3.0}, last_good=None, unit=DEAD)
    assert undo_plan(first, [], C) == UndoPlan(UndoKind.STOP)
    assert undo_plan(None, [], C) == UndoPlan(UndoKind.STOP)
    # A release that was current but stopped (an earlier UNPROVEN), forced again: nothing to restart.
    assert undo_plan(snap(last_good=None, unit=DEAD), [], B) == UndoPlan(UndoKind.STOP)


def test_good_releases_put_last_good_first_once() -> None:
    s = snap(current=C, last_good=A)
    assert good_releases(s, [passed(A), passed(B), passed(A)], C) == [A, B]


# ------------------------------------------------------------------------------------------------ summary (item 2)


def test_the_summary_says_what_served_before() -> None:
    res = DeployResult("h", HistoryEvent.DEPLOY, B, DeployVerdict.FAIL, "gate FAIL")
    res.rolled_back_to, res.rollback_verdict = B, NoRollback.AS_BEFORE
    assert f"rolled back to {B} (what served before): restarted, not gated" in res.line()
    stopped = DeployResult("h", HistoryEvent.DEPLOY, C, DeployVerdict.UNPROVEN, "no traffic")
    stopped.rollback_verdict = NoRollback.UNIT_STOPPED
    assert "nothing to roll back to: unit stopped and disabled" in stopped.line()


# ------------------------------------------------------------------------------------------------ up to date (item 6)


def test_up_to_date_needs_the_running_invocation_gated() -> None:
    assert redeploy_reason(B, snap(), [passed(B, INV)]) is None
    restarted = snap(unit=replace(ACTIVE, invocation_id="2" * 32))
    why = redeploy_reason(B, restarted, [passed(B, INV)]) or ""
    assert "was never gated" in why and "222222222222" in why
    # A record of an older opsctl names no invocation: not proof of the running one.
    assert "was never gated" in (redeploy_reason(B, snap(), [passed(B)]) or "")
    assert "was never gated" in (redeploy_reason(B, snap(unit=replace(ACTIVE, invocation_id="")), [passed(B)]) or "")
    # Activating (systemd restarting it) says so first.
    activating = snap(unit=replace(ACTIVE, active_state="activating", invocation_id="3" * 32))
    assert "unit is activating" in (redeploy_reason(B, activating, [passed(B, INV)]) or "")


def test_the_invocation_is_written_to_the_history_and_read_back() -> None:
    rec = passed(B, INV)
    assert rec.as_json()["invocation"] == INV
    assert HistoryRecord.from_json(rec.as_json()) == rec


# ------------------------------------------------------------------------------------------------ marks (item 2, 7)


def test_views_never_show_last_good_and_bad_at_once() -> None:
    assert reconciled_last_good(B, frozenset({B})) is None
    assert reconciled_last_good(B, frozenset({A})) == B
    text = f"root_exists=1\nmanaged={{}}\ncurrent=releases/{B}\nrelease=2 {B}\nbad={B} {{}}\nlast_good={B}\n"
    parsed = releaseroot.parse_snapshot(text)
    assert B in parsed.bad and parsed.last_good is None


def test_marks_on_a_real_shell(tmp_path: Path) -> None:
    """mark_bad drops a last-good mark naming the release; set_last_good drops its bad mark; remove_current removes
    only the symlink."""
    layout = releaseroot.Layout(str(tmp_path / "root"))
    r = LocalRemote()
    for d in (layout.bad, layout.release(A), layout.release(B)):
        Path(d).mkdir(parents=True)
    releaseroot.set_last_good(r, layout, B)
    releaseroot.mark_bad(r, layout, A, "gate FAIL")
    assert Path(layout.last_good).read_text() == f"{B}\n"  # another release's mark leaves it
    releaseroot.mark_bad(r, layout, B, "gate FAIL under stricter thresholds")
    assert not Path(layout.last_good).exists() and Path(f"{layout.bad}/{B}").exists()
    releaseroot.set_last_good(r, layout, B)  # a later PASS of the same release
    assert Path(layout.last_good).read_text() == f"{B}\n" and not Path(f"{layout.bad}/{B}").exists()
    assert Path(f"{layout.bad}/{A}").exists()
    releaseroot.switch_current(r, layout, B)
    releaseroot.remove_current(r, layout)
    assert not Path(layout.current).is_symlink() and Path(layout.release(B)).is_dir()
    Path(layout.current).mkdir()  # a hand-made directory under that name is never removed
    releaseroot.remove_current(r, layout)
    assert Path(layout.current).is_dir()
