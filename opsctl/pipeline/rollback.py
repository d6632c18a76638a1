"""The rollback: every path that puts an earlier release back goes through this module.

- ``rollback_target``: where a rollback goes (``--to``, else the newest good release other than current). Pure.
- ``undo_plan``: where a failed deploy goes back to (a good release other than the failed one; else what served
  before, as it served; else nothing). Pure.
- ``restore_previous``: switch back, install the release's unit (its template rendered with today's inventory,
  opsctl/unit/unitfile.py), restart and gate it; or stop and disable the unit when there is nothing to go back
  to, or when that unit would drop a setting the running unit has from the inventory. A deploy's failed restart
  undoes itself with it (``undo_restart``; ``restart_as_before`` when only what served before is left), and
  ``restart --rollback-on-fail`` with ``rollback_if_failed_step``.
- ``rollback``: the ``opsctl rollback`` command (also what ``health --rollback-on-fail`` and group roll-backs run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from ..errors import DeployFailed
from ..gate.decision import Verdict
from ..host import history as host_history
from ..host import releaseroot
from ..host.releaseroot import HostSnapshot
from ..inventory import HostConfig
from ..ssh.session import Connect, default_connect
from ..unit import systemctl, unitfile
from .plan import DeployOptions
from .report import Reporter
from .result import DeployResult, DeployVerdict, HistoryEvent, HistoryRecord, NoRollback
from .runner import Run, Step, execute, lock_step
from .signals import interruptible
from .steps import gate_step, require_managed, restart_step, snapshot, switch_step, unit_step
from .watch import gate_detail, restart_unit, run_gate


def _chosen_target(snap: HostSnapshot, to: str, force: bool) -> str:
    """--to ID: a release on the host, not current, and not a bad one unless forced."""
    releaseroot.check_id(to)
    if to not in snap.releases:
        raise DeployFailed(f"release {to} is not on the host (have: {', '.join(sorted(snap.releases)) or 'none'})")
    if to in snap.bad and not force:
        raise DeployFailed(f"release {to} is marked bad; use --force to roll back to it anyway")
    if to == snap.current:
        raise DeployFailed(f"release {to} is already current")
    return to


def good_releases(snap: HostSnapshot, history: Sequence[HistoryRecord], exclude: str | None) -> list[str]:
    """Releases that passed a gate (or were adopted), newest first, the recorded last-good one before them; only
    those still on the host, not ``exclude`` and not marked bad. Pure."""

    def usable(release: str | None) -> bool:
        return bool(release) and release != exclude and release in snap.releases and release not in snap.bad

    passed = [r.release for r in history if r.verdict is DeployVerdict.PASS or r.event is HistoryEvent.ADOPT]
    candidates = list(dict.fromkeys(r for r in reversed(passed) if r and usable(r)))
    if snap.last_good and usable(snap.last_good):
        candidates = [snap.last_good, *(c for c in candidates if c != snap.last_good)]
    return candidates


def _good_candidates(snap: HostSnapshot, history: list[HistoryRecord]) -> list[str]:
    """Where `opsctl rollback` may go: the good releases other than current."""
    return good_releases(snap, history, snap.current)


class UndoKind(StrEnum):
    """How a deploy's restart is undone (``undo_plan``)."""

    ROLLBACK = "rollback"  # switch to a release, install its unit (today's inventory), restart, gate
    AS_BEFORE = "as before"  # restart what served before, with the unit it ran with; not gated
    STOP = "stop"  # nothing may run: the unit stopped and disabled


@dataclass(frozen=True)
class UndoPlan:
    kind: UndoKind
    target: str | None = None


SERVING_STATES = frozenset({"active", "activating", "reloading"})


def undo_plan(snap: HostSnapshot | None, history: Sequence[HistoryRecord], failed: str) -> UndoPlan:
    """Where a deploy whose new release ``failed`` goes back to (issue 47). Pure.

    1. the release that was current, when it is another one, on the host and not marked bad (gated again);
    2. else the newest good release other than the failed one (gated);
    3. else, when the unit was serving as the deploy began, what served then, as it served (a forced redeploy of
       the only good release under stricter thresholds, or a changed ``service.tp``: never leave a unit stopped
       that was serving);
    4. else nothing: the unit is stopped and disabled (no earlier good release: a reboot must not start one no
       gate passed)."""
    if snap is None:
        return UndoPlan(UndoKind.STOP)
    previous = snap.current
    if previous and previous != failed and previous in snap.releases and previous not in snap.bad:
        return UndoPlan(UndoKind.ROLLBACK, previous)
    good = good_releases(snap, history, failed)
    if good:
        return UndoPlan(UndoKind.ROLLBACK, good[0])
    if previous and previous in snap.releases and snap.unit.active_state in SERVING_STATES:
        return UndoPlan(UndoKind.AS_BEFORE, previous)
    return UndoPlan(UndoKind.STOP)


def rollback_target(snap: HostSnapshot, to: str | None, force: bool, history: list[HistoryRecord]) -> str:
    """Where `opsctl rollback` goes: --to ID, else the newest good release other than current. Pure."""
    if to is not None:
        return _chosen_target(snap, to, force)
    candidates = _good_candidates(snap, history)
    if not candidates:
        raise DeployFailed(
            "nothing to roll back to: no other release on the host has passed a gate"
            + (f" (current is {snap.current})" if snap.current else " (no release deployed yet)")
        )
    return candidates[0]


def restore_previous(run: Run, target: str | None, failed: str) -> None:
    """After ``failed`` was (or may have been) started: switch back to ``target``, restart and gate it (with the
    host's full deadline: a --gate-timeout was meant for the new release); with no target, stop the unit."""
    host, layout, result = run.host, run.layout, run.result
    why_none = "nothing to roll back to"
    if target is not None:
        try:  # checked before anything is switched: its unit would lose a setting from the inventory
            run.call(lambda r: unitfile.unit_for_release(r, host, layout, target))
        except unitfile.UnitSettingsLost as e:
            run.reporter.info(e.message)
            why_none, target = f"not back to {target} (its unit would drop an inventory setting)", None
            run.switched = False  # `current` stays on the failed release, its unit stopped: nothing half-switched
    if target is None:
        with run.timer.timed(run.reporter, "rollback", f"{why_none}: stopping and disabling the unit") as note:
            _stop_and_disable(run)
            note["detail"] = f"{why_none}: unit stopped and disabled, current {result.current_after or 'none'}"
        result.rolled_back_to, result.rollback_verdict = None, NoRollback.UNIT_STOPPED
        return
    with run.timer.timed(run.reporter, "rollback", f"current -> {target}") as note:
        run.call(lambda r: releaseroot.switch_current(r, layout, target))
        run.call(lambda r: unitfile.install_for_release(r, host, layout, target))
        run.switched = False
        result.current_after = target
        mark = run.call(lambda r: restart_unit(r, host, run.reporter))
        note["detail"] = "restarted"
    seen: list[str] = []
    with run.timer.timed(run.reporter, "gate (rollback)") as note:
        gate = run_gate(
            run.session,
            host,
            mark,
            run.reporter,
            deadline_s=max(run.opts.gate_timeout_s or 0.0, host.gate.deadline_s),
            seen_invocations=seen,
        )
        note["detail"] = gate_detail(gate)
    verdict = DeployVerdict.from_gate(gate.verdict)
    result.rolled_back_to, result.rollback_verdict = target, verdict
    run.record(
        HistoryRecord(
            event=HistoryEvent.ROLLBACK,
            release=target,
            rolled_back_from=failed,
            verdict=verdict,
            gate=gate.summary(),
            automatic=True,
            invocation=seen[-1] if seen else None,
        )
    )
    if gate.verdict is Verdict.PASS:
        run.call(lambda r: releaseroot.set_last_good(r, layout, target))


def _stop_and_disable(run: Run) -> None:
    """Nothing may run: the unit stopped and disabled (a reboot must not start a release no gate passed, issue 47);
    `current` back where it was (a first deploy: no `current` at all), with the unit file that was installed then,
    not enabled. Done here in full, so that the switch and unit undos after it have nothing left to do."""
    host, layout = run.host, run.layout
    run.call(lambda r: r.run(systemctl.stop_and_disable_command(host.unit), timeout=300, check=False))
    if not run.switched:
        return  # `current` was not switched, or is deliberately left on the failed release (its unit stopped)
    previous, before = run.previous, run.unit_before
    if previous:
        run.call(lambda r: releaseroot.switch_current(r, layout, previous))
    else:
        run.call(lambda r: releaseroot.remove_current(r, layout))
    if before is not None:
        run.call(lambda r: unitfile.install(r, host, before, unitfile.read_installed(r, host)))
    run.switched = False
    run.result.current_after = previous


def restart_as_before(run: Run, release: str, before: str, failed: str) -> None:
    """Nothing else to go back to, and the unit was serving: ``release`` (what was current) restarted with the
    unit file it ran with (``before``, byte for byte: not its template under today's inventory, which may be what
    was rejected, e.g. a changed ``service.tp``). Not gated: under today's settings the gate has just failed it;
    the point is that the host serves as it did before the deploy, and the summary says so."""
    host, layout, result = run.host, run.layout, run.result
    with run.timer.timed(run.reporter, "rollback", f"current -> {release} (what served before)") as note:
        run.call(lambda r: releaseroot.switch_current(r, layout, release))
        run.call(lambda r: unitfile.install(r, host, before, unitfile.read_installed(r, host)))
        run.call(lambda r: r.run(systemctl.enable_once_command(host.unit), timeout=60, check=False))
        run.switched = False
        result.current_after = release
        run.call(lambda r: restart_unit(r, host, run.reporter))
        state = run.call(
            lambda r: r.run(systemctl.action_argv("is-active", host.unit), timeout=60, check=False).stdout.strip()
        )
        note["detail"] = f"no other good release: restarted as it served before, not gated (unit {state or '?'})"
    result.rolled_back_to, result.rollback_verdict = release, NoRollback.AS_BEFORE
    run.record(
        HistoryRecord(
            event=HistoryEvent.ROLLBACK,
            release=release,
            rolled_back_from=failed,
            verdict=DeployVerdict.DONE,
            reason="what served before, restarted with the unit it ran with: no other good release (not gated)",
            automatic=True,
        )
    )


def undo_restart(run: Run) -> None:
    """A deploy's restart undone (``undo_plan``): a good release other than the failed one comes back, gated; else
    what served before, as it served; else the unit is stopped and disabled."""
    failed = run.result.release or ""
    history = run.call(lambda r: host_history.read_history(r, run.layout)) if run.snap is not None else []
    plan = undo_plan(run.snap, history, failed)
    before = run.unit_before
    if plan.kind is UndoKind.AS_BEFORE and plan.target is not None and before is not None:
        restart_as_before(run, plan.target, before, failed)
        return
    restore_previous(run, plan.target if plan.kind is UndoKind.ROLLBACK else None, failed)


def rollback_if_failed_step() -> Step:
    """--rollback-on-fail: the restarted release is marked bad (unless the gate was UNPROVEN: no verify traffic
    is no verdict on it) and the newest good one comes back."""

    def run_(run: Run) -> None:
        failed = run.result.release or ""
        reason = f"gate {run.result.verdict} after restart: {run.result.reason}"
        config_error = run.gate is not None and run.gate.config_error  # the gate's configuration, not the release
        if run.result.verdict.marks_bad and not config_error:
            run.call(lambda r: releaseroot.mark_bad(r, run.layout, failed, reason))
        history = run.call(lambda r: host_history.read_history(r, run.layout))
        after = run.call(lambda r: releaseroot.read_snapshot(r, run.host.root, run.host.unit))
        try:
            target = rollback_target(after, None, False, history)
            run.call(lambda r: unitfile.unit_for_release(r, run.host, run.layout, target))  # UnitSettingsLost
        except DeployFailed as e:
            run.reporter.info(f"cannot roll back: {e.message}")
            return
        restore_previous(run, target, failed)

    return Step(
        "rollback on fail",
        run_,
        when=lambda run: run.result.verdict is not DeployVerdict.PASS,
        shown=False,
    )


def _rollback_preflight(to: str | None, force: bool) -> Step:
    def run_(run: Run) -> str:
        snap = snapshot(run)
        require_managed(snap, run.host)
        history = run.call(lambda r: host_history.read_history(r, run.layout))
        target = rollback_target(snap, to, force, history)
        # Refused here, before the lock and the switch, when its unit would drop a setting from the inventory.
        run.call(lambda r: unitfile.unit_for_release(r, run.host, run.layout, target))
        run.result.release = target
        return f"{snap.current or 'none'} -> {target}"

    return Step("preflight", run_)


def _record_rollback(gated: bool, force: bool) -> Step:
    def run_(run: Run) -> None:
        target = run.result.release or ""
        if not gated:
            run.conclude(DeployVerdict.DONE, "not gated (--no-gate)")
        elif run.gate is not None and run.gate.verdict is Verdict.PASS:
            run.call(lambda r: releaseroot.set_last_good(r, run.layout, target))
        run.record(
            HistoryRecord(
                event=HistoryEvent.ROLLBACK,
                release=target,
                rolled_back_from=run.previous,
                verdict=run.result.verdict,
                gate=run.result.gate,
                forced=force,
                invocation=run.gated_invocation if gated else None,
            )
        )

    return Step("record", run_, shown=False)


def rollback_steps(to: str | None, force: bool, gated: bool) -> list[Step]:
    target = lambda run: run.result.release or ""  # noqa: E731
    steps = [
        _rollback_preflight(to, force),
        lock_step(lambda run: f"rollback {run.result.release}"),
        switch_step(target, undoable=False),
        unit_step(target, undoable=False),
        restart_step(),
    ]
    if gated:
        steps.append(gate_step())
    return [*steps, _record_rollback(gated, force)]


@interruptible
def rollback(
    host: HostConfig,
    reporter: Reporter | None = None,
    *,
    to: str | None = None,
    force: bool = False,
    gate: bool = True,
    gate_timeout_s: float | None = None,
    connect: Connect = default_connect,
) -> DeployResult:
    """Switch back to an earlier release (never a bad one unless forced), restart, gate."""
    opts = DeployOptions(gate_timeout_s=gate_timeout_s)
    with Run.open(host, HistoryEvent.ROLLBACK, reporter, connect, opts) as run:
        return execute(run, rollback_steps(to, force, gate))
