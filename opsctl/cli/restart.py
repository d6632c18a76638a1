"""``opsctl restart`` (gate what runs) and ``opsctl rollback`` (put an earlier release back, restart, gate).

Both refuse before they ask: the host is read first (one SSH command, nothing changed) and what the command would
refuse there (the lock held, an install opsctl does not manage, no current release, nothing to roll back to)
ends it before the confirmation prompt (``check_restart``, ``check_rollback``: pure)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import EXIT_NOT_CONFIRMED, DeployFailed, LockHeld, UsageError
from . import common

if TYPE_CHECKING:
    from ..host.history import HistoryRecord
    from ..host.releaseroot import HostSnapshot
    from ..inventory import HostConfig

console = common.out


def confirm_restart(yes: bool, question: str) -> None:
    """Every command that restarts the service from a keyboard asks first, as deploy does: a restart costs the host
    its model load (minutes of no serving), and a mistyped host name must not cost that. Scripts, the health
    timer and fleet roll-outs pass --yes (or call the library)."""
    if not yes and not typer.confirm(question, default=False):
        raise typer.Exit(code=EXIT_NOT_CONFIRMED)


def _check_lock(h: HostConfig, snap: HostSnapshot) -> None:
    from ..lock import hostlock

    if snap.lock_present and not snap.lock_stale:
        raise LockHeld(
            f"{h.name}: the deploy lock is held by {hostlock.describe_owner(snap.lock_owner)}. Wait for it, or if that "
            f"run is gone: opsctl lock {h.name} release --force"
        )


def check_restart(h: HostConfig, snap: HostSnapshot) -> None:
    """What `restart` would refuse on this host, before it asks: the lock held, a host opsctl does not manage, no
    current release. Pure."""
    _check_lock(h, snap)
    if not snap.is_managed:
        raise DeployFailed(
            f"{h.name} is not managed by opsctl yet: `opsctl deploy {h.name}` (virgin host) or `opsctl adopt {h.name}` "
            "first"
        )
    if not snap.current:
        raise DeployFailed(f"{h.name}: no current release to restart")


def check_rollback(h: HostConfig, snap: HostSnapshot, history: list[HistoryRecord], to: str | None, force: bool) -> str:
    """Where `rollback` would go on this host, or why it refuses, before it asks: the lock held, a host opsctl does
    not manage, no release to go back to (``--to`` not on the host, current, or marked bad). Pure."""
    from ..pipeline.rollback import rollback_target

    check_restart(h, snap)
    return rollback_target(snap, to, force, history)


def restart_command(
    host: common.HostArg = None,
    rollback_on_fail: Annotated[
        bool,
        typer.Option(
            "--rollback-on-fail",
            help="if the gate does not pass: mark the release bad and roll back to the last good one",
        ),
    ] = False,
    gate_timeout: Annotated[
        float | None,
        typer.Option("--gate-timeout", parser=common.finite(0), help="gate deadline in seconds (default: inventory)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
    plain: common.PlainOption = False,
    verbose: common.VerboseOption = False,
    inventory_path: common.InventoryOption = None,
) -> None:
    """Restart the current release and gate it (e.g. after a driver update). Exit 0 on a PASS, 31 otherwise."""
    from .. import pipeline
    from ..host import views
    from . import progress

    h = common.host_of(host, inventory_path, "restart")
    host = h.name
    if not yes:
        check_restart(h, views.read_releases(h).snap)
    confirm_restart(yes, f"Restart {h.unit} on {host} (the model loads again) and gate it?")
    with progress.reporter(host, as_json, action="restart", plain=plain, verbose=verbose) as rep:
        res = pipeline.restart(h, rep, rollback_on_fail=rollback_on_fail, gate_timeout_s=gate_timeout)
    if not res.ok and not rollback_on_fail and not as_json:
        console.print(
            f"the gate did not pass; the release stays current. Decide: `opsctl rollback {host}` or investigate with `opsctl logs {host} --grep parity`",
            style="yellow",
            soft_wrap=True,
        )
    progress.finish(res, as_json)


def rollback_command(
    host: common.TargetArg = None,
    to: Annotated[
        str | None, typer.Option("--to", help="release id (default: the newest good one before current)")
    ] = None,
    force: Annotated[bool, typer.Option("--force", help="allow a release marked bad")] = False,
    no_gate: Annotated[bool, typer.Option("--no-gate", help="do not gate after the restart")] = False,
    gate_timeout: Annotated[
        float | None,
        typer.Option("--gate-timeout", parser=common.finite(0), help="gate deadline in seconds (default: inventory)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    parallel: Annotated[bool, typer.Option("--parallel", help="group only: all hosts side by side")] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
    plain: common.PlainOption = False,
    verbose: common.VerboseOption = False,
    inventory_path: common.InventoryOption = None,
) -> None:
    """Switch HOST (or every host of a GROUP) back to an earlier release, restart and gate it."""
    from .. import pipeline
    from ..fleet import rollout as fleet
    from . import progress
    from .rollout import run_fleet

    inv = common.inventory(inventory_path)
    host = common.pick_target(inv, host, "rollback")
    if host not in inv.hosts:
        if to is not None:
            raise UsageError("--to names one release of one host; roll a group back to each host's last good release")
        plan = fleet.plan_rollout(inv.resolve(host), max_fail="100%")  # every host is tried: a rollback is a repair
        kwargs = {"force": force, "gate": not no_gate, "gate_timeout_s": gate_timeout}
        run_fleet(
            host, plan, lambda emit: fleet.rollback_action(emit, **kwargs), "rollback", parallel, False, yes, as_json
        )
        return
    from ..host import views

    h = inv.host(host)
    if not yes:
        view = views.read_releases(h)
        target = check_rollback(h, view.snap, view.history, to, force)
        now = view.snap.current or "nothing"
        confirm_restart(yes, f"Roll {host} back from {now} to {target} and restart it?")
    with progress.reporter(host, as_json, action="rollback", plain=plain, verbose=verbose) as rep:
        res = pipeline.rollback(h, rep, to=to, force=force, gate=not no_gate, gate_timeout_s=gate_timeout)
    progress.finish(res, as_json)


app = typer.Typer()
app.command("restart")(common.bounded(restart_command))
app.command("rollback")(common.bounded(rollback_command))
