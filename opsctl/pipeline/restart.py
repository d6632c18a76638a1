"""``restart``: the current release restarted and gated (e.g. after a driver update). It has no undo: there is no
"before" to go back to that would be better than what it leaves; with ``--rollback-on-fail`` a failed gate hands
over to the rollback (opsctl.pipeline.rollback). The verdict goes to the history.

Like a deploy it compares the release before and after the restart (opsctl/pipeline/comparison.py): the same
release on both sides, an A/A check that must pass; a comparison FAIL is the restart's verdict (stage
``comparison``)."""

from __future__ import annotations

from ..errors import DeployFailed
from ..host import releaseroot
from ..inventory import HostConfig
from ..ssh.session import Connect, default_connect
from ..unit import systemctl
from .comparison import ComparisonState, baseline_step, comparison_step
from .plan import DeployOptions
from .report import Reporter
from .result import DeployResult, DeployVerdict, HistoryEvent, HistoryRecord
from .rollback import rollback_if_failed_step
from .runner import Run, Step, execute, lock_step
from .signals import interruptible
from .steps import gate_step, require_managed, restart_step, snapshot


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
        run.record(
            HistoryRecord(
                event=HistoryEvent.RESTART,
                release=release,
                verdict=run.result.verdict,
                gate=run.result.gate,
                comparison=run.result.comparison,
                stage=run.result.stage,
                reason=run.result.reason if run.result.stage else None,
                invocation=run.gated_invocation,
            )
        )
        if run.result.verdict is DeployVerdict.PASS:
            run.call(lambda r: releaseroot.set_last_good(r, run.layout, release))
            # A failed deploy may have left the unit disabled (nothing good to run then); passed now, boots start it.
            run.call(lambda r: r.run(systemctl.enable_once_command(run.host.unit), timeout=60, check=False))

    return Step("record", run_, shown=False)


def restart_steps(rollback_on_fail: bool) -> list[Step]:
    compared = ComparisonState()
    steps = [
        _restart_preflight(),
        lock_step(lambda run: f"restart {run.result.release}"),
        baseline_step(compared, refused_is_error=False),
        restart_step(),
        gate_step(),
        comparison_step(compared, rejects=False),
        _record_restart(),
    ]
    return [*steps, rollback_if_failed_step()] if rollback_on_fail else steps


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
    with Run.open(host, HistoryEvent.RESTART, reporter, connect, opts) as run:
        return execute(run, restart_steps(rollback_on_fail))
