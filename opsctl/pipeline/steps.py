"""The steps deploy, restart, rollback and adopt are made of, and their undos (opsctl/pipeline/runner.py runs them).

Each factory returns a ``Step``; the commands (deploy.py, restart.py, rollback.py, adopt.py) list them. The undo
that brings the previous release back is the rollback's (opsctl/pipeline/rollback.py)."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import DeployFailed
from ..gate.decision import Verdict
from ..host import releaseroot
from ..host.releaseroot import HostSnapshot
from ..inventory import HostConfig
from ..unit import unitfile
from .result import DeployVerdict
from .runner import Rejected, Run, Step
from .watch import gate_detail, restart_unit, run_gate

# ------------------------------------------------------------------------------------------------ host acts


def require_managed(snap: HostSnapshot, host: HostConfig) -> None:
    if not snap.is_managed:
        raise DeployFailed(
            f"{host.name} is not managed by opsctl yet: `opsctl deploy {host.name}` (virgin host) or `opsctl adopt {host.name}` first"
        )


def snapshot(run: Run) -> HostSnapshot:
    """The host as preflight sees it. Not retried: an unreachable host fails the command at once."""
    run.snap = releaseroot.read_snapshot(run.r, run.host.root, run.host.unit)
    return run.snap


# ------------------------------------------------------------------------------------------------ steps


def switch_step(target: Callable[[Run], str], *, undoable: bool) -> Step:
    """Point `current` at ``target``; undone by pointing it back at what was current before."""

    def run_(run: Run) -> str:
        releaseroot.switch_current(run.r, run.layout, target(run))
        run.switched = True
        run.result.current_after = target(run)
        return ""

    def undo(run: Run) -> None:
        previous = run.previous
        if run.switched and previous:
            run.call(lambda r: releaseroot.switch_current(r, run.layout, previous))
            run.switched = False
            run.result.current_after = previous
        elif run.switched:
            # A first deploy rejected: `current` did not exist before, and must not point at a release no gate
            # passed (a reboot, or a hand-made `systemctl start`, would run it; issue 47).
            run.call(lambda r: releaseroot.remove_current(r, run.layout))
            run.switched = False
            run.result.current_after = None

    return Step("switch", run_, undo=undo if undoable else None, detail=lambda run: f"current -> {target(run)}")


def unit_step(target: Callable[[Run], str], *, undoable: bool) -> Step:
    """Install the unit stored with ``target``; undone by installing the previous release's unit again."""

    def run_(run: Run) -> str:
        run.unit_before = unitfile.read_installed(run.r, run.host)
        return (
            "changed, daemon-reload"
            if unitfile.install_for_release(run.r, run.host, run.layout, target(run))
            else "unchanged"
        )

    def undo(run: Run) -> None:
        previous, before = run.previous, run.unit_before
        if not (run.switched and previous):
            return
        if previous == target(run) and before is not None:
            # The same release deployed again (--force, a changed inventory): put back the unit it ran with, not
            # its template under today's inventory, which is what was just rejected (issue 47: a changed TP).
            run.call(lambda r: unitfile.install(r, run.host, before, unitfile.read_installed(r, run.host)))
            return
        run.call(lambda r: unitfile.install_for_release(r, run.host, run.layout, previous))

    return Step("unit", run_, undo=undo if undoable else None)


def restart_step(*, undo: Callable[[Run], None] | None = None) -> Step:
    """Restart the unit with a fresh parity token. A deploy passes the undo that brings the previous release back
    (opsctl.pipeline.rollback.undo_restart); restart and rollback have none."""

    def run_(run: Run) -> str:
        run.restarted = True  # from here the new release may be running, whatever the reply says
        run.mark = restart_unit(run.r, run.host, run.reporter)
        return ""

    return Step("restart", run_, undo=undo)


def gate_step() -> Step:
    """Follow the new invocation's journal until the gate decides; the verdict goes to the result."""

    def run_(run: Run) -> str:
        assert run.mark is not None, "the gate follows a restart"
        seen: list[str] = []
        gate = run_gate(
            run.session, run.host, run.mark, run.reporter, deadline_s=run.opts.gate_timeout_s, seen_invocations=seen
        )
        run.gate = gate
        run.gated_invocation = seen[-1] if seen else None
        run.result.gate = gate.summary()
        run.conclude(DeployVerdict.from_gate(gate.verdict), gate.reason)
        return gate_detail(gate)

    return Step("gate", run_)


def gate_or_reject_step(*, commits: bool = True) -> Step:
    """The deploy's gate: a PASS commits the run; anything else rejects the new release: the previous one comes
    back, and the new one is marked bad unless the verdict is UNPROVEN (no verify traffic: no verdict on it).
    With ``commits`` false a PASS leaves the run open for a later check to reject (the comparison, deploy.py)."""
    inner = gate_step()

    def run_(run: Run) -> str:
        detail = inner.run(run) or ""
        gate = run.gate
        assert gate is not None
        if gate.verdict is not Verdict.PASS:
            raise Rejected(
                DeployVerdict.from_gate(gate.verdict),
                gate.reason,
                record_reason=f"gate {gate.verdict}: {gate.reason}",
                gate=gate.summary(),
                detail=detail,
                config_error=gate.config_error,
            )
        # The gate decided: a later failure is the bookkeeping's, not a reason to restore (unless a check follows).
        run.committed = commits
        return detail

    return Step("gate", run_)
