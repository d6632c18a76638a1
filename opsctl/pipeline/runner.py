"""The step runner every host command goes through: deploy, restart, rollback and adopt are lists of ``Step``s.

One runner owns what they share: the timings and progress lines, the deploy lock (released whatever happens),
the history record of a failure, and the compensation. A step's ``undo`` runs when a later step (or the step
itself) fails, is interrupted, or rejects the release, in reverse order, before the lock is released. Undos are
idempotent and look at the ``Run`` (``switched``, ``restarted``) rather than assume the step finished.

How a run ends (every outcome):
- all steps ran: the verdict the steps set (``run.result.verdict``), e.g. PASS;
- a step raised ``Concluded``: that verdict (UP-TO-DATE, PLANNED, STAGED, ...); nothing is undone;
- a step raised ``Rejected`` (the new release failed a check): the release is marked bad, the failure recorded,
  every started step undone; the verdict is the rejection's (FAIL, NODATA, INCONCLUSIVE, ERROR); an UNPROVEN
  rejection (no verify traffic reached the gate) is undone the same way but does not mark the release bad;
- an ``OpsError`` after a restart that may have started the new release (and before the run was committed):
  the same compensation, verdict ERROR ("... the previous release was restored");
- any other ``OpsError`` while the lock is held: the failure is recorded, undos run quietly, the error goes on;
- ``KeyboardInterrupt`` (Ctrl-C, SIGTERM, SIGHUP) while the lock is held: an INTERRUPTED record is written,
  undos run, the interrupt goes on;
- once a step has ``committed`` the run (the gate passed), later failures are the bookkeeping's: nothing is
  undone, the error goes on.
Compensation runs with further signals held (noted, not acted on): a restore is never abandoned half-way.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import DeployFailed, OpsError, SshError
from ..gate.decision import GateState
from ..host import history as host_history
from ..host import releaseroot
from ..host.releaseroot import HostSnapshot
from ..hostdata.layout import Layout
from ..inventory import HostConfig
from ..journal.query import Mark
from ..lock import hostlock
from ..lock.hostlock import LockOwner
from ..lock.lease import LeaseKeeper, take_lock
from ..ssh.session import Connect, DeployRemote, Session
from .plan import DeployOptions
from .report import NullReporter, Reporter, StepTimer
from .result import DeployResult, DeployVerdict, HistoryEvent, HistoryRecord
from .signals import interruption, signals_held

T = TypeVar("T")


class Concluded(Exception):
    """A step ends the command here with ``verdict`` (nothing to undo)."""

    def __init__(self, verdict: DeployVerdict, reason: str, detail: str = "") -> None:
        super().__init__(reason)
        self.verdict, self.reason, self.detail = verdict, reason, detail


class Rejected(Exception):
    """The new release failed a check: mark it bad and undo what was done. ``reason`` goes to the result,
    ``record_reason`` (default: the same) to the history and the bad mark."""

    def __init__(
        self,
        verdict: DeployVerdict,
        reason: str,
        *,
        record_reason: str | None = None,
        gate: dict[str, Any] | None = None,
        stage: str | None = None,
        detail: str = "",
        config_error: bool = False,
    ) -> None:
        super().__init__(reason)
        self.verdict, self.reason, self.gate, self.stage = verdict, reason, gate, stage
        self.record_reason = record_reason or reason
        self.detail = detail or reason
        # The gate's own configuration failed (every probe request refused): rolled back, not marked bad.
        self.config_error = config_error

    @property
    def marks_bad(self) -> bool:
        return self.verdict.marks_bad and not self.config_error


@dataclass
class Run:
    """What one command's steps share: the host and its connection, the options, the host as preflight found it,
    and what has been done to it so far."""

    host: HostConfig
    session: Session
    reporter: Reporter
    connect: Connect
    result: DeployResult
    opts: DeployOptions = field(default_factory=DeployOptions)
    timer: StepTimer = field(default_factory=StepTimer)
    started_at: float = field(default_factory=time.monotonic)
    snap: HostSnapshot | None = None
    owner: LockOwner | None = None
    lease: LeaseKeeper | None = None
    locked: bool = False
    switched: bool = False  # `current` points at the new release
    restarted: bool = False  # the unit may be running the new release (set before the restart command)
    committed: bool = False  # the release is vouched for: later failures are not undone
    mark: Mark | None = None
    gate: GateState | None = None
    gated_invocation: str | None = None  # the unit's InvocationID the last gate judged (recorded with its verdict)
    # The unit file installed when the command began (read by the unit step before it installs another): what a
    # failed deploy puts back when it restarts what served before (rollback.py, issue 47).
    unit_before: str | None = None

    @property
    def layout(self) -> Layout:
        return Layout(self.host.root)

    @property
    def r(self) -> DeployRemote:
        return self.session.r

    @property
    def previous(self) -> str | None:
        """What was current when the command started."""
        return self.snap.current if self.snap is not None else None

    def call(self, fn: Callable[[DeployRemote], T]) -> T:
        return self.session.call(fn)

    def record(self, record: HistoryRecord) -> None:
        self.call(lambda r: host_history.append_history(r, self.layout, record))

    def conclude(self, verdict: DeployVerdict, reason: str) -> None:
        self.result.verdict, self.result.reason = verdict, reason

    @classmethod
    @contextlib.contextmanager
    def open(
        cls,
        host: HostConfig,
        action: HistoryEvent,
        reporter: Reporter | None,
        connect: Connect,
        opts: DeployOptions | None = None,
        release: str | None = None,
    ) -> Iterator[Run]:
        timer = StepTimer()
        result = DeployResult(host=host.name, action=action, release=release, step_times=timer.times)
        with Session(host, connect) as session:
            yield cls(
                host=host,
                session=session,
                reporter=reporter or NullReporter(),
                connect=connect,
                result=result,
                opts=opts or DeployOptions(),
                timer=timer,
            )


@dataclass(frozen=True)
class Step:
    """One step: ``run`` returns the detail shown when it is done (or raises); ``undo`` compensates it."""

    name: str
    run: Callable[[Run], str | None]
    undo: Callable[[Run], None] | None = None
    detail: Callable[[Run], str] | None = None  # shown when the step starts
    when: Callable[[Run], bool] | None = None  # the step is skipped when this says no
    shown: bool = True  # bookkeeping steps run without a progress line of their own
    after_rejection: bool = False  # also runs after a rejection, once the host is restored (a deploy's cleanup)


def lock_step(label: Callable[[Run], str]) -> Step:
    """Take the deploy lock (its lease renewed by a thread while held); ``execute`` releases it."""

    def take(run: Run) -> str:
        # The owner is set before the acquire: a reply lost after the remote mkdir still ends in the release.
        run.owner = LockOwner.mine(label(run))
        detail = take_lock(run.session, run.host, run.owner, run.reporter)
        run.locked = True
        run.lease = LeaseKeeper(run.host, run.owner, run.connect)
        return detail

    return Step("lock", take)


def execute(run: Run, steps: Sequence[Step]) -> DeployResult:
    """Run the steps in order; every outcome is listed in the module's docstring."""
    started: list[Step] = []
    try:
        for step in steps:
            if step.when is not None and not step.when(run):
                continue
            started.append(step)
            if not _run_step(run, step):
                break
    except Rejected as rej:
        with signals_held(run.reporter):
            _compensate(run, started, rej.verdict, rej.record_reason, bad=rej.marks_bad, gate=rej.gate, stage=rej.stage)
            _after_rejection(run, steps, started)
        run.conclude(rej.verdict, rej.reason)
    except KeyboardInterrupt as e:
        if not run.locked or run.committed:
            raise
        with signals_held(run.reporter):
            run.reporter.info(f"{interruption(e)}: restoring a consistent state; further signals wait until it is done")
            run.session.drop()  # the signal may have cut a command mid-reply: talk over a fresh connection
            try:
                _compensate(run, started, DeployVerdict.INTERRUPTED, interruption(e), bad=False)
            except OpsError as failed:
                run.reporter.info(f"restoring failed: {failed.message}")
        raise
    except OpsError as e:
        if not run.locked or run.committed:
            raise
        if run.restarted and any(s.undo is not None for s in started):
            # The restart or the gate broke off (SSH drop, timeout): the new release may be running unverified
            # while nothing vouches for it. Never leave it so: back to the old release, restarted and gated.
            run.session.drop()
            with signals_held(run.reporter):
                _compensate(run, started, DeployVerdict.ERROR, f"restart/gate broke off: {e.message}", bad=True)
            run.conclude(DeployVerdict.ERROR, f"{e.message}; the previous release was restored")
        else:
            with signals_held(run.reporter), contextlib.suppress(Exception):
                _compensate(run, started, DeployVerdict.ERROR, e.message, bad=False)
            raise
    finally:
        _unlock(run)
        run.result.elapsed_s = time.monotonic() - run.started_at
    return run.result


def _after_rejection(run: Run, steps: Sequence[Step], started: list[Step]) -> None:
    """The steps that run after a rejection too (a deploy's cleanup), under the lock, once the host is restored; a
    failure of theirs is reported, never raised: the verdict stands."""
    for step in steps:
        if step.after_rejection and step not in started:
            try:
                _run_step(run, step)
            except OpsError as e:
                run.reporter.info(f"{step.name} failed: {e.message}")


def _run_step(run: Run, step: Step) -> bool:
    """One step, timed and reported; False when it concluded the command."""
    if not step.shown:
        try:
            step.run(run)
        except Concluded as c:
            run.conclude(c.verdict, c.reason)
            return False
        return True
    with run.timer.timed(run.reporter, step.name, step.detail(run) if step.detail else "") as note:
        try:
            note["detail"] = step.run(run) or ""
        except Concluded as c:
            note["detail"] = c.detail
            run.conclude(c.verdict, c.reason)
            return False
        except Rejected as rej:
            note["detail"] = rej.detail
            raise
    return True


def _compensate(
    run: Run,
    started: list[Step],
    verdict: DeployVerdict,
    reason: str,
    *,
    bad: bool,
    gate: dict[str, Any] | None = None,
    stage: str | None = None,
) -> None:
    """Mark the release bad (a verdict on it, not an interruption), record what happened, undo every started
    step in reverse. Each remote step is retried across SSH drops; a host that stays unreachable ends in
    DeployFailed saying where it stands."""
    release = run.result.release or "-"
    try:
        if bad:
            run.call(lambda r: releaseroot.mark_bad(r, run.layout, release, reason))
        # Where `current` points once restored: back on the previous release, or (a first deploy, nothing to go
        # back to) nowhere: the undo removes it, so that no reboot starts a release no gate passed (issue 47).
        current = run.previous
        run.record(
            HistoryRecord(
                event=run.result.action,
                release=release,
                verdict=verdict,
                reason=reason,
                previous=run.previous,
                current=current,
                gate=gate,
                stage=stage,
                comparison=run.result.comparison,
            )
        )
        for step in reversed(started):
            if step.undo is not None:
                step.undo(run)
    except SshError as e:
        raise DeployFailed(
            f"{reason}, and restoring the previous release failed ({e.message}): release {release} may be running "
            f"NOT verified. The deploy lock's lease expires by itself. When the host answers: opsctl status "
            f"{run.host.name}, then opsctl rollback {run.host.name} (or opsctl restart {run.host.name} to gate what runs)"
        ) from e


def _unlock(run: Run) -> None:
    if run.lease is not None:
        run.lease.stop()
    owner = run.owner
    if owner is None:
        return
    with signals_held(run.reporter), contextlib.suppress(Exception):
        run.call(lambda r: hostlock.release_lock(r, run.layout, owner))
