"""``deploy``: a new release onto one host, as a list of steps (docs/pipeline.md).

preflight -> lock -> upload -> verify -> build -> parity -> speed -> baseline -> switch -> unit -> restart -> gate ->
comparison -> record -> cleanup

Before ``switch`` nothing that runs has changed (``baseline`` only sends the comparison workload to the running
release); ``switch``, ``unit`` and ``restart`` have undos, so a failure, a rejected release or a signal anywhere up
to the comparison's verdict brings the previous release back (runner.py)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..errors import CommandFailed, DeployFailed, GateFailed, LockHeld
from ..host import history as host_history
from ..host import releaseroot
from ..hostdata import facts
from ..inventory import HostConfig
from ..lock import hostlock
from ..release import Manifest, make_manifest, stage
from ..speed.check import run_speed_check
from ..speed.judge import SpeedVerdict
from ..ssh.session import Connect, DeployRemote, default_connect
from ..ssh.transfer import RsyncStats
from ..unit import unitfile
from . import prerestart as checks
from .comparison import ComparisonState, baseline_step, comparison_step
from .plan import DeployOptions, make_plan, redeploy_reason
from .report import ParityRecorder, Reporter
from .result import DeployResult, DeployVerdict, HistoryEvent, HistoryRecord
from .rollback import undo_restart
from .runner import Concluded, Rejected, Run, Step, execute, lock_step
from .signals import interruptible
from .steps import gate_or_reject_step, restart_step, snapshot, switch_step, unit_step


def _environment_file_refusal(run: Run) -> str | None:
    """Why the unit could not read its ``service.environment_file`` on the host (None: it can, or the inventory says
    the file is optional). The unit reads the API key from it; a typo in the path once served with no key, the
    deploy passing (issue 47). Checked before anything is uploaded, so a refused deploy leaves no trace."""
    host = run.host
    path = host.service.environment_file
    if not path or host.service.environment_file_optional:
        return None
    res = run.r.run(facts.environment_file_command(path), timeout=60, check=False)
    problem = facts.environment_file_problem(res.stdout)
    if problem is None:
        return None
    return (
        f"{host.where('service', 'environment_file')}: {path} {problem} on {host.name}, and the unit reads the "
        "API key from it (without it the server would answer with no key). Fix the path or create the file on "
        "the host; or, if the server may run without it, set service.environment_file_optional: true"
    )


def _preflight(manifest: Manifest) -> Step:
    def run_(run: Run) -> str:
        host, opts = run.host, run.opts
        snap = snapshot(run)
        # Whether the current release is up to date needs its last gate: read only when it is the one deployed.
        current = snap.current == manifest.id and not opts.force
        history = host_history.read_history(run.r, run.layout) if current else []
        plan = make_plan(host, manifest, snap, opts, history)
        run.result.plan = plan
        run.result.current_after = snap.current
        detail = f"current {snap.current or 'none'}, unit {snap.unit.active_state}, {snap.free_mb} MB free"
        if current and not plan.up_to_date and not plan.refusal:
            detail += f"; {redeploy_reason(manifest.id, snap, history)}: deploying it again"
        if snap.lock_present and not snap.lock_stale and not opts.dry_run:
            raise LockHeld(
                f"{host.name}: the deploy lock is held by {hostlock.describe_owner(snap.lock_owner)}. Wait for it, or if "
                f"that run is gone: opsctl lock {host.name} release --force"
            )
        refusal = plan.refusal or _environment_file_refusal(run)
        if refusal:
            if opts.dry_run:
                raise Concluded(DeployVerdict.REFUSED, refusal, detail)
            raise DeployFailed(refusal)
        if plan.up_to_date:
            raise Concluded(
                DeployVerdict.UP_TO_DATE,
                f"{manifest.id} is already current, its last gate passed and the unit is active; "
                f"`opsctl restart {host.name}` restarts and gates it, --force redeploys",
                detail,
            )
        if opts.dry_run:
            raise Concluded(DeployVerdict.PLANNED, "dry run: nothing changed", detail)
        return detail

    return Step("preflight", run_, detail=lambda run: f"{run.host.name} ({run.host.target})")


def _start_record(manifest: Manifest) -> Step:
    def run_(run: Run) -> None:
        releaseroot.ensure_layout(run.r, run.layout, adopted=False)
        owner = run.owner
        assert owner is not None, "the start is recorded under the lock"
        run.record(
            HistoryRecord(
                event=HistoryEvent.DEPLOY_START,
                release=manifest.id,
                previous=run.previous,
                by=f"{owner.user}@{owner.client}",
                commit=manifest.commit,
                dirty=manifest.dirty,
            )
        )

    return Step("record start", run_, shown=False)


def _send(run: Run, src: Path, manifest: Manifest, link_dest: str | None) -> RsyncStats:
    """rsync the staged release into its directory on the host. rsync compares content (``--checksum``,
    opsctl/ssh/transfer.py): a file is linked from ``link_dest``, or left as the host has it, only when it holds
    the manifest's bytes, whatever its size and mtime (issue 47)."""
    with tempfile.TemporaryDirectory(prefix="opsctl-bundle-") as tmp:
        staged = stage(src, manifest, Path(tmp) / manifest.id)
        return run.r.rsync(staged, run.layout.release(manifest.id), link_dest=link_dest, timeout=1800)


def _upload(src: Path, manifest: Manifest) -> Step:
    def run_(run: Run) -> str:
        plan = run.result.plan
        stats = _send(run, src, manifest, plan.link_dest if plan else None)
        run.result.bytes_sent = stats.bytes_sent
        # Counted as verify counts them (the release's files; manifest.json travels beside them), so the two
        # steps' numbers agree; rsync sends only what the previous release (--link-dest) does not already hold.
        total = len(manifest.files)
        sent = max(0, stats.files_transferred - 1)  # rsync's count includes manifest.json, which is always new
        reused = f", {total - sent} linked from {plan.link_dest.rsplit('/', 1)[-1]}" if plan and plan.link_dest else ""
        return f"{total} files + manifest ({sent} sent{reused}), {stats.bytes_sent} bytes"

    return Step("upload", run_, detail=lambda run: run.layout.release(manifest.id))


def _mismatched(run: Run, manifest: Manifest) -> list[str]:
    """The release's files on the host that do not match the manifest's sha256 (missing ones included)."""
    command = releaseroot.verify_checksums_command(run.layout.release(manifest.id))
    res = run.r.run(command, stdin=manifest.checklist(), timeout=300, check=False)
    failed = releaseroot.parse_checksum_failures(res.stdout)
    if res.rc != 0 and not failed:  # sha256sum itself failed (no directory, no sha256sum): not a mismatch
        raise CommandFailed(run.host.name, command, res.rc, res.stderr[-400:])
    return failed


def _listed(files: list[str], most: int = 5) -> str:
    """File names for a message: at most ``most``, each escaped unless printable (a name is the tree's text)."""
    shown = ", ".join(f if f.isprintable() else repr(f) for f in files[:most])
    return shown + (f" and {len(files) - most} more" if len(files) > most else "")


def _verify(src: Path, manifest: Manifest) -> Step:
    """Every file against the manifest's sha256. What does not match is uploaded again once (rsync compares
    content, so only those files go, none linked) and checked again; a second mismatch fails the deploy, naming the
    files. A later deploy's upload sends them again too: rsync never keeps a file for its size and mtime alone."""

    def run_(run: Run) -> str:
        release_dir = run.layout.release(manifest.id)
        again = ""
        mismatched = _mismatched(run, manifest)
        if mismatched:
            run.reporter.info(
                f"verify: {len(mismatched)} file(s) differ from the manifest ({_listed(mismatched)}): uploading again"
            )
            _send(run, src, manifest, link_dest=None)
            still = _mismatched(run, manifest)
            if still:
                raise DeployFailed(
                    f"{run.host.name}: {len(still)} file(s) in {release_dir} still differ from the manifest after "
                    f"the upload and one retry: {_listed(still)}. Something on the host changes them (its disk, "
                    "a process writing there); nothing was switched"
                )
            again = f"; {len(mismatched)} uploaded again after a mismatch ({_listed(mismatched, 3)})"
        remote = Manifest.from_json(run.r.read_file(f"{release_dir}/manifest.json"))
        if remote.id != manifest.id:
            raise DeployFailed(f"manifest on the host names {remote.id}, expected {manifest.id}")
        return f"{len(manifest.files)} files + manifest match{again}"

    return Step("verify", run_)


def _build(manifest: Manifest) -> Step:
    return Step("build", lambda run: checks.build(run.r, run.host, run.layout, manifest.id))


def _parity(manifest: Manifest) -> Step:
    """Pre-restart parity: a FAIL rejects the release before anything that runs has changed."""

    def run_(run: Run) -> str:
        seen = ParityRecorder(run.reporter)
        try:
            return checks.prerestart_parity(run.r, run.host, run.layout, manifest.id, seen)
        except GateFailed as e:
            # Reported like the gate: the lines (above), verdict FAIL, the failing layers in the reason.
            reason = checks.prerestart_fail_reason(seen.lines, run.host.gate.fail_rel) or e.message
            raise Rejected(DeployVerdict.FAIL, reason, stage="pre-restart parity", detail=f"FAIL: {reason}") from e

    return Step("parity", run_, when=lambda run: not run.opts.skip_prerestart_parity)


def _speed(manifest: Manifest) -> Step:
    """Pre-restart speed check: the new verify path timed against the running release's on the host; a slower one
    is refused before the switch (the running release keeps serving, no restart), marked bad, exit 31. A check that
    cannot run says so and lets the deploy go on (docs/gate.md "The pre-restart speed check")."""

    def run_(run: Run) -> str:
        judged = run_speed_check(run.r, run.host, run.layout, manifest.id, run.previous)
        run.result.speed = judged.summary()
        if judged.verdict is SpeedVerdict.FAIL:
            reason = f"pre-restart {judged.line()}: {judged.reason}; nothing switched or restarted"
            raise Rejected(DeployVerdict.FAIL, reason, stage="pre-restart speed", detail=f"FAIL: {judged.line()}")
        return judged.line()

    return Step("speed", run_, when=lambda run: run.host.gate.speed.enabled and not run.opts.skip_prerestart_parity)


def _store_unit(src: Path, manifest: Manifest) -> Step:
    def run_(run: Run) -> None:
        text = unitfile.render_from_tree(src, run.host)
        run.r.write_file(f"{run.layout.release(manifest.id)}/unit.service", text.encode())

    return Step("store unit", run_, shown=False)


def _staged(manifest: Manifest) -> Step:
    """--no-restart: `current` is switched, the running service picks it up at its next restart."""

    def run_(run: Run) -> None:
        run.record(
            HistoryRecord(
                event=HistoryEvent.DEPLOY, release=manifest.id, verdict=DeployVerdict.STAGED, reason="--no-restart"
            )
        )
        run.committed = True
        raise Concluded(
            DeployVerdict.STAGED,
            f"current switched; the running service picks it up at the next `opsctl restart {run.host.name}`",
        )

    return Step("staged", run_, when=lambda run: run.opts.no_restart, shown=False)


def _record_pass(manifest: Manifest) -> Step:
    def run_(run: Run) -> None:
        run.call(lambda r: releaseroot.set_last_good(r, run.layout, manifest.id))
        run.record(
            HistoryRecord(
                event=HistoryEvent.DEPLOY,
                release=manifest.id,
                previous=run.previous,
                verdict=DeployVerdict.PASS,
                gate=run.result.gate,
                comparison=run.result.comparison,
                invocation=run.gated_invocation,
            )
        )

    return Step("record", run_, shown=False)


def _cleanup(manifest: Manifest) -> Step:
    """After every deploy that took the lock, passed or rejected: keep current, last good, this release and the
    ``keep_releases`` newest; what it removed goes into the history (``opsctl releases`` shows it)."""

    def run_(run: Run) -> str:
        def remove(r: DeployRemote) -> list[str]:
            snap = releaseroot.read_snapshot(r, run.host.root, run.host.unit)
            keep = [snap.current, snap.last_good, manifest.id, run.previous]
            doomed = releaseroot.select_for_removal(snap.releases, run.host.keep_releases, keep)
            releaseroot.remove_releases(r, run.layout, doomed)
            return doomed

        removed = run.call(remove)
        if not removed:
            return "nothing to remove"
        run.record(HistoryRecord(event=HistoryEvent.CLEANUP, release=manifest.id, removed=removed))
        return f"removed {', '.join(removed)} (keeping the {run.host.keep_releases} newest, current and last good)"

    return Step("cleanup", run_, after_rejection=True)


def deploy_steps(src: Path, manifest: Manifest, command: str = "deploy") -> list[Step]:
    """``command`` names the lock's owner (``deploy``, or a fleet roll-out's wave)."""
    new = lambda run: manifest.id  # noqa: E731
    compared = ComparisonState()  # the baseline, from before the switch, for the comparison after the gate
    return [
        _preflight(manifest),
        lock_step(lambda run: f"{command} {manifest.id}"),
        _start_record(manifest),
        _upload(src, manifest),
        _verify(src, manifest),
        _build(manifest),
        _parity(manifest),
        _speed(manifest),
        _store_unit(src, manifest),
        baseline_step(compared),
        switch_step(new, undoable=True),
        unit_step(new, undoable=True),
        _staged(manifest),
        restart_step(undo=undo_restart),
        gate_or_reject_step(commits=False),  # the comparison's verdict commits the run
        comparison_step(compared, rejects=True),
        _record_pass(manifest),
        _cleanup(manifest),
    ]


@interruptible
def deploy(
    host: HostConfig,
    src: Path,
    opts: DeployOptions,
    reporter: Reporter | None = None,
    *,
    connect: Connect = default_connect,
    command: str = "deploy",
) -> DeployResult:
    """Deploy the tree at ``src`` to ``host`` and gate it; every outcome is a ``DeployResult`` or an OpsError."""
    manifest = make_manifest(src)
    with Run.open(host, HistoryEvent.DEPLOY, reporter, connect, opts, release=manifest.id) as run:
        return execute(run, deploy_steps(src, manifest, command))
