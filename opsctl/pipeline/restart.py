"""``restart`` and ``rollback``: the current release restarted and gated (e.g. after a driver update), or an earlier
release switched back in, restarted and gated. Neither has an undo: there is no "before" to go back to that would
be better than what they leave, and both record their verdict in the history."""

from __future__ import annotations

from ..errors import DeployFailed
from ..gate.decision import Verdict
from ..host import history as host_history
from ..host import releaseroot as hs
from ..inventory import HostConfig
from ..ssh.session import Connect, default_connect
from .plan import DeployOptions, rollback_target
from .report import Reporter
from .result import DeployResult, DeployVerdict, HistoryRecord
from .runner import Run, Step, execute, lock_step
from .signals import interruptible
from .steps import gate_step, require_managed, restart_step, restore_previous, snapshot, switch_step, unit_step


def _restart_preflight() -> Step:
    def run_(run: Run) -> str:
        snap = snapshot(run)
        require_managed(snap, run.host)
        if not snap.current:
            raise DeployFailed(f"{run.host.name}: no current release to restart")
        run.result.release = run.result.current_after = snap.current
        return f"current {snap.current}, unit {snap.unit.active_state}"

    return Step("preflight", run_)


def _record_restart() -> Step:
    def run_(run: Run) -> None:
        release = run.result.release or ""
        run.record(HistoryRecord(event="restart", release=release, verdict=run.result.verdict, gate=run.result.gate))
        if run.result.verdict is DeployVerdict.PASS:
            run.call(lambda r: hs.set_last_good(r, run.layout, release))

    return Step("record", run_, shown=False)


def _rollback_if_failed() -> Step:
    """--rollback-on-fail: the restarted release is marked bad (unless the gate was UNPROVEN: no verify traffic
    is no verdict on it) and the newest good one comes back."""

    def run_(run: Run) -> None:
        failed = run.result.release or ""
        reason = f"gate {run.result.verdict} after restart: {run.result.reason}"
        if run.result.verdict.marks_bad:
            run.call(lambda r: hs.mark_bad(r, run.layout, failed, reason))
        history = run.call(lambda r: host_history.read_history(r, run.layout))
        after = run.call(lambda r: hs.read_snapshot(r, run.host.root, run.host.unit))
        try:
            target = rollback_target(after, None, False, history)
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


def restart_steps(rollback_on_fail: bool) -> list[Step]:
    steps = [
        _restart_preflight(),
        lock_step(lambda run: f"restart {run.result.release}"),
        restart_step(undoable=False),
        gate_step(),
        _record_restart(),
    ]
    return [*steps, _rollback_if_failed()] if rollback_on_fail else steps


@interruptible
def restart(
    host: HostConfig,
    reporter: Reporter | None = None,
    *,
    rollback_on_fail: bool = False,
    gate_timeout_s: float | None = None,
    connect: Connect = default_connect,
) -> DeployResult:
    """Restart the current release and gate it; with ``rollback_on_fail`` a failed gate rolls back."""
    opts = DeployOptions(gate_timeout_s=gate_timeout_s)
    with Run.open(host, "restart", reporter, connect, opts) as run:
        return execute(run, restart_steps(rollback_on_fail))


def _rollback_preflight(to: str | None, force: bool) -> Step:
    def run_(run: Run) -> str:
        snap = snapshot(run)
        require_managed(snap, run.host)
        history = run.call(lambda r: host_history.read_history(r, run.layout))
        target = rollback_target(snap, to, force, history)
        run.result.release = target
        return f"{snap.current or 'none'} -> {target}"

    return Step("preflight", run_)


def _record_rollback(gated: bool, force: bool) -> Step:
    def run_(run: Run) -> None:
        target = run.result.release or ""
        if not gated:
            run.conclude(DeployVerdict.DONE, "not gated (--no-gate)")
        elif run.gate is not None and run.gate.verdict is Verdict.PASS:
            run.call(lambda r: hs.set_last_good(r, run.layout, target))
        run.record(
            HistoryRecord(
                event="rollback",
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
        restart_step(undoable=False),
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
    with Run.open(host, "rollback", reporter, connect, opts) as run:
        return execute(run, rollback_steps(to, force, gate))
