"""The steps deploy, restart, rollback and adopt are made of, and their undos (opsctl/deploy/runner.py runs them).

Each factory returns a ``Step``; the commands (ship.py, restart.py, rollback.py, adopt.py) list them."""

from __future__ import annotations

from collections.abc import Callable

from ..errors import DeployFailed
from ..gate.decision import GateState, Verdict
from ..host import releaseroot as hs
from ..host.releaseroot import HostSnapshot, Layout
from ..inventory import HostConfig
from ..ssh.remote import Remote
from ..unit import systemctl as unit_commands
from ..unit import unitfile as unitmod
from .result import DeployVerdict, HistoryRecord
from .runner import Rejected, Run, Step
from .watch import restart_unit, run_gate

# ------------------------------------------------------------------------------------------------ host acts


def read_unit_text(r: Remote, host: HostConfig) -> str | None:
    res = r.run(unit_commands.read_unit_file_command(host.unit), timeout=60, check=False)
    return res.stdout if res.rc == 0 else None


def install_unit_for(r: Remote, host: HostConfig, layout: Layout, release: str) -> bool:
    """Install the unit stored with a release (rendered at its deploy, or the hand-made one for release zero)."""
    text = r.read_file(f"{layout.release(release)}/unit.service").decode()
    changed = unitmod.install(r, host, text, read_unit_text(r, host))
    r.run(unit_commands.enable_once_command(host.unit), timeout=60, check=False)
    return changed


def require_managed(snap: HostSnapshot, host: HostConfig) -> None:
    if not snap.is_managed:
        raise DeployFailed(
            f"{host.name} is not managed by opsctl yet: `opsctl deploy {host.name}` (virgin host) or `opsctl adopt {host.name}` first"
        )


def snapshot(run: Run) -> HostSnapshot:
    """The host as preflight sees it. Not retried: an unreachable host fails the command at once."""
    run.snap = hs.read_snapshot(run.r, run.host.root, run.host.unit)
    return run.snap


def gate_detail(gate: GateState) -> str:
    return f"{gate.verdict}: {gate.reason}"


# ------------------------------------------------------------------------------------------------ steps


def switch_step(target: Callable[[Run], str], *, undoable: bool) -> Step:
    """Point `current` at ``target``; undone by pointing it back at what was current before."""

    def run_(run: Run) -> str:
        hs.switch_current(run.r, run.layout, target(run))
        run.switched = True
        run.result.current_after = target(run)
        return ""

    def undo(run: Run) -> None:
        previous = run.previous
        if run.switched and previous:
            run.call(lambda r: hs.switch_current(r, run.layout, previous))
            run.switched = False
            run.result.current_after = previous

    return Step("switch", run_, undo=undo if undoable else None, detail=lambda run: f"current -> {target(run)}")


def unit_step(target: Callable[[Run], str], *, undoable: bool) -> Step:
    """Install the unit stored with ``target``; undone by installing the previous release's unit again."""

    def run_(run: Run) -> str:
        return "changed, daemon-reload" if install_unit_for(run.r, run.host, run.layout, target(run)) else "unchanged"

    def undo(run: Run) -> None:
        previous = run.previous
        if run.switched and previous:
            run.call(lambda r: install_unit_for(r, run.host, run.layout, previous))

    return Step("unit", run_, undo=undo if undoable else None)


def restart_step(*, undoable: bool) -> Step:
    """Restart the unit with a fresh parity token. Its undo brings the previous release back, restarted and gated
    (or stops the unit when there is nothing to go back to)."""

    def run_(run: Run) -> str:
        run.restarted = True  # from here the new release may be running, whatever the reply says
        run.mark = restart_unit(run.r, run.host, run.reporter)
        return ""

    def undo(run: Run) -> None:
        failed = run.result.release or ""
        previous = run.previous
        snap = run.snap
        ok = previous and previous != failed and snap is not None and previous not in snap.bad
        restore_previous(run, previous if ok else None, failed)

    return Step("restart", run_, undo=undo if undoable else None)


def gate_step() -> Step:
    """Follow the new invocation's journal until the gate decides; the verdict goes to the result."""

    def run_(run: Run) -> str:
        assert run.mark is not None, "the gate follows a restart"
        gate = run_gate(run.session, run.host, run.mark, run.reporter, deadline_s=run.opts.gate_timeout_s)
        run.gate = gate
        run.result.gate = gate.summary()
        run.conclude(DeployVerdict(str(gate.verdict)), gate.reason)
        return gate_detail(gate)

    return Step("gate", run_)


def gate_or_reject_step() -> Step:
    """The deploy's gate: a PASS commits the run; anything else rejects the new release: the previous one comes
    back, and the new one is marked bad unless the verdict is UNPROVEN (no verify traffic: no verdict on it)."""
    inner = gate_step()

    def run_(run: Run) -> str:
        detail = inner.run(run) or ""
        gate = run.gate
        assert gate is not None
        if gate.verdict is not Verdict.PASS:
            raise Rejected(
                DeployVerdict(str(gate.verdict)),
                gate.reason,
                record_reason=f"gate {gate.verdict}: {gate.reason}",
                gate=gate.summary(),
                detail=detail,
            )
        # The gate decided: a later failure is the bookkeeping's, not a reason to restore.
        run.committed = True
        return detail

    return Step("gate", run_)


def restore_previous(run: Run, target: str | None, failed: str) -> None:
    """After ``failed`` was (or may have been) started: switch back to ``target``, restart and gate it (with the
    host's full deadline: a --gate-timeout was meant for the new release); with no target, stop the unit."""
    host, layout, result = run.host, run.layout, run.result
    if target is None:
        with run.timer.timed(run.reporter, "rollback", "nothing to roll back to: stopping the unit"):
            run.r.run(unit_commands.action_argv("stop", host.unit), timeout=300, check=False)
        result.rolled_back_to, result.rollback_verdict = None, "unit stopped"
        return
    with run.timer.timed(run.reporter, "rollback", f"current -> {target}") as note:
        run.call(lambda r: hs.switch_current(r, layout, target))
        run.call(lambda r: install_unit_for(r, host, layout, target))
        run.switched = False
        result.current_after = target
        mark = run.call(lambda r: restart_unit(r, host, run.reporter))
        note["detail"] = "restarted"
    with run.timer.timed(run.reporter, "gate (rollback)") as note:
        gate = run_gate(
            run.session, host, mark, run.reporter, deadline_s=max(run.opts.gate_timeout_s or 0.0, host.gate.deadline_s)
        )
        note["detail"] = gate_detail(gate)
    result.rolled_back_to, result.rollback_verdict = target, str(gate.verdict)
    run.record(
        HistoryRecord(
            event="rollback",
            release=target,
            rolled_back_from=failed,
            verdict=str(gate.verdict),
            gate=gate.summary(),
            automatic=True,
        )
    )
    if gate.verdict is Verdict.PASS:
        run.call(lambda r: hs.set_last_good(r, layout, target))
