"""The rollback: every path that puts an earlier release back goes through this module.

- ``rollback_target``: where a rollback goes (``--to``, else the newest good release other than current). Pure.
- ``restore_previous``: switch back, install the release's unit (its template rendered with today's inventory,
  opsctl/unit/unitfile.py), restart and gate it; or stop the unit when there is nothing to go back to, or when
  that unit would drop a setting the running unit has from the inventory. A deploy's failed restart undoes
  itself with it (``undo_restart``), and ``restart --rollback-on-fail`` with ``rollback_if_failed_step``.
- ``rollback``: the ``opsctl rollback`` command (also what ``health --rollback-on-fail`` and group roll-backs run).
"""

from __future__ import annotations

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


def _good_candidates(snap: HostSnapshot, history: list[HistoryRecord]) -> list[str]:
    """Releases that passed a gate (or were adopted), newest first, the recorded last-good one before them; only
    those still on the host, not current and not marked bad."""

    def usable(release: str | None) -> bool:
        return bool(release) and release != snap.current and release in snap.releases and release not in snap.bad

    passed = [r.release for r in history if r.verdict is DeployVerdict.PASS or r.event is HistoryEvent.ADOPT]
    candidates = [r for r in reversed(passed) if r and usable(r)]
    if snap.last_good and usable(snap.last_good):
        candidates.insert(0, snap.last_good)
    return candidates


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
        with run.timer.timed(run.reporter, "rollback", f"{why_none}: stopping the unit"):
            run.r.run(systemctl.action_argv("stop", host.unit), timeout=300, check=False)
        result.rolled_back_to, result.rollback_verdict = None, NoRollback.UNIT_STOPPED
        return
    with run.timer.timed(run.reporter, "rollback", f"current -> {target}") as note:
        run.call(lambda r: releaseroot.switch_current(r, layout, target))
        run.call(lambda r: unitfile.install_for_release(r, host, layout, target))
        run.switched = False
        result.current_after = target
        mark = run.call(lambda r: restart_unit(r, host, run.reporter))
        note["detail"] = "restarted"
    with run.timer.timed(run.reporter, "gate (rollback)") as note:
        gate = run_gate(
            run.session, host, mark, run.reporter, deadline_s=max(run.opts.gate_timeout_s or 0.0, host.gate.deadline_s)
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
        )
    )
    if gate.verdict is Verdict.PASS:
        run.call(lambda r: releaseroot.set_last_good(r, layout, target))


def undo_restart(run: Run) -> None:
    """A deploy's restart undone: the previous release comes back (never a bad one, never the failed one itself),
    or the unit is stopped when there is none."""
    failed = run.result.release or ""
    previous = run.previous
    snap = run.snap
    ok = previous and previous != failed and snap is not None and previous not in snap.bad
    restore_previous(run, previous if ok else None, failed)


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
