"""``opsctl restart`` (gate what runs) and ``opsctl rollback`` (put an earlier release back, restart, gate)."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import EXIT_NOT_CONFIRMED, UsageError
from . import common

console = common.out


def confirm_restart(yes: bool, question: str) -> None:
    """Every command that restarts the service from a keyboard asks first, as deploy does: a restart costs the host
    its model load (minutes of no serving), and a mistyped host name must not cost that. Scripts, the health
    timer and fleet roll-outs pass --yes (or call the library)."""
    if not yes and not typer.confirm(question, default=False):
        raise typer.Exit(code=EXIT_NOT_CONFIRMED)


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
    inventory_path: common.InventoryOption = None,
) -> None:
    """Restart the current release and gate it (e.g. after a driver update). Exit 0 on a PASS, 31 otherwise."""
    from .. import pipeline
    from . import progress

    h = common.host_of(host, inventory_path, "restart")
    host = h.name
    confirm_restart(yes, f"Restart {h.unit} on {host} (the model loads again) and gate it?")
    with progress.reporter(host, as_json, action="restart") as rep:
        res = pipeline.restart(h, rep, rollback_on_fail=rollback_on_fail, gate_timeout_s=gate_timeout)
    if not res.ok and not rollback_on_fail and not as_json:
        console.print(
            f"the gate did not pass; the release stays current. Decide: `opsctl rollback {host}` or investigate with `opsctl logs {host} --grep parity`",
            style="yellow",
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
    h = inv.host(host)
    confirm_restart(yes, f"Roll {host} back to {to or 'its newest good release before current'} and restart it?")
    with progress.reporter(host, as_json, action="rollback") as rep:
        res = pipeline.rollback(h, rep, to=to, force=force, gate=not no_gate, gate_timeout_s=gate_timeout)
    progress.finish(res, as_json)


app = typer.Typer()
app.command("restart")(common.bounded(restart_command))
app.command("rollback")(common.bounded(rollback_command))
