"""``opsctl deploy``: ship the working tree to a host (or a group, canary first then batches), gate it, and roll
back by itself on failure. Exit 0 only on PASS (also up to date, planned, staged); DEPLOY_EXIT_CODES lists the rest."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import EXIT_NOT_CONFIRMED, DeployFailed, UsageError
from . import common

if TYPE_CHECKING:
    from ..inventory import HostConfig
    from ..pipeline import DeployOptions, Plan

console = common.out


DEPLOY_EXIT_CODES = """Exit codes: 0 PASS (also up to date, --dry-run planned, --no-restart staged);
1 not confirmed at the prompt, or an unexpected error; 2 usage or inventory error;
11 host unreachable, 12 ssh authentication failed, 13 host key unknown, 14 host key changed,
15 a remote command failed, 16 a remote command timed out; 20 the host's deploy lock is held;
30 deploy failed or refused (nothing gated; also a gate ERROR: the host could not be read);
31 parity FAIL, NODATA or INCONCLUSIVE, before the restart or at the gate (rolled back);
32 UNPROVEN: no verify traffic reached the gate (rolled back, not marked bad). See docs/exit-codes.md."""


def _gate_rules(h: HostConfig) -> str:
    g = h.gate
    return (
        f"  gate rules: a parity line passes at rel <= {g.pass_rel:g} and fails at rel >= {g.fail_rel:g} (or NaN/inf: "
        f"the deploy fails at once); a line in between is INCONCLUSIVE: it restarts the pass count and the gate "
        f"keeps reading. No {g.consecutive_passes} passes in a row by the deadline: INCONCLUSIVE (no line at all: "
        f"NODATA), both handled as a FAIL (rolled back). See docs/gate.md."
    )


def deploy_command(
    host: common.TargetArg = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="print the plan, change nothing")] = False,
    no_restart: Annotated[
        bool, typer.Option("--no-restart", help="install and switch, but do not restart or gate")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="do not ask for confirmation")] = False,
    gate_timeout: Annotated[
        float | None,
        typer.Option("--gate-timeout", parser=common.finite(0), help="gate deadline in seconds (default: inventory)"),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="deploy even if this release is current or marked bad")
    ] = False,
    skip_parity: Annotated[
        bool, typer.Option("--skip-prerestart-parity", help="skip the pre-restart parity run on the host")
    ] = False,
    src: Annotated[Path | None, typer.Option("--src", help="working tree to deploy (default: this checkout)")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    canary: Annotated[
        str | None, typer.Option("--canary", help="group only: deploy and gate this host first (default: the first)")
    ] = None,
    batch: Annotated[
        str | None, typer.Option("--batch", help="group only: hosts per batch, N or P% (default: all)")
    ] = None,
    max_fail: Annotated[
        str | None, typer.Option("--max-fail", help="group only: failures tolerated, P% of the hosts (default: 0%)")
    ] = None,
    parallel: Annotated[bool, typer.Option("--parallel", help="group only: the hosts of a batch side by side")] = False,
    plain: common.PlainOption = False,
    verbose: common.VerboseOption = False,
    inventory_path: common.InventoryOption = None,
) -> None:
    """Deploy the working tree to HOST (or a GROUP, canary first then batches): upload, build, parity, switch,
    restart, gate; each host rolls itself back on failure. The plan is printed when there is work to do."""
    from .. import pipeline
    from ..release import default_tree

    tree = (src or default_tree()).resolve()
    inv = common.inventory(inventory_path)
    target = common.pick_target(inv, host, "deploy")
    opts = pipeline.DeployOptions(
        gate_timeout_s=gate_timeout, force=force, no_restart=no_restart, skip_prerestart_parity=skip_parity
    )
    if target not in inv.hosts:
        group = GroupChoices(canary=canary, batch=batch, max_fail=max_fail, parallel=parallel)
        deploy_group(target, inv.resolve(target), tree, opts, group, Asked(dry_run, yes, as_json, plain, verbose))
        return
    if canary or batch or max_fail or parallel:
        raise UsageError(f"{target} is a single host: --canary, --batch, --max-fail and --parallel are for groups")
    deploy_host(target, inv.host(target), tree, opts, Asked(dry_run, yes, as_json, plain, verbose))


@dataclass(frozen=True)
class Asked:
    """What the operator asked of the command's output and prompt (not of the deploy itself)."""

    dry_run: bool
    yes: bool
    as_json: bool
    plain: bool
    verbose: bool


@dataclass(frozen=True)
class GroupChoices:
    """The group-only options: the canary, the batch size, the failure budget, the hosts of a batch side by side."""

    canary: str | None
    batch: str | None
    max_fail: str | None
    parallel: bool


def deploy_group(
    target: str, hosts: list[HostConfig], tree: Path, opts: DeployOptions, group: GroupChoices, asked: Asked
) -> None:
    """A group: the roll-out's plan (canary, batches, failure budget), asked for, then each host deployed."""
    from ..fleet import rollout as fleet
    from .rollout import run_fleet

    plan = fleet.plan_rollout(
        hosts, canary=group.canary or fleet.default_canary(hosts), batch=group.batch, max_fail=group.max_fail
    )
    run_fleet(
        target,
        plan,
        lambda emit: fleet.deploy_action(tree, opts, emit),
        "deploy",
        group.parallel,
        asked.dry_run,
        asked.yes,
        asked.as_json,
    )


def deploy_host(target: str, h: HostConfig, tree: Path, opts: DeployOptions, asked: Asked) -> None:
    """One host: its plan (a dry run of the same options) printed, asked for, then the deploy with its live view."""
    from .. import pipeline
    from . import progress

    planned = pipeline.deploy(h, tree, dataclasses.replace(opts, dry_run=True))
    if planned.plan is not None and planned.verdict is pipeline.DeployVerdict.PLANNED and not asked.as_json:
        print_plan(h, planned.plan, opts, asked)
    if planned.verdict is pipeline.DeployVerdict.REFUSED and asked.dry_run:
        raise DeployFailed(f"deploy would be refused: {planned.reason}")
    if asked.dry_run or planned.verdict is pipeline.DeployVerdict.UP_TO_DATE:
        progress.finish(planned, asked.as_json)
        return
    # A refusal is raised by the real run below with its own type (LockHeld, DeployFailed): no question first.
    if planned.verdict is not pipeline.DeployVerdict.REFUSED and not asked.yes:
        confirm(f"Deploy {planned.release} to {target}?")
    with progress.reporter(
        target, asked.as_json, release=planned.release, plain=asked.plain, verbose=asked.verbose
    ) as rep:
        res = pipeline.deploy(h, tree, opts, rep)
    progress.finish(res, asked.as_json)


def confirm(question: str) -> None:
    """Asked at the prompt; anything but yes exits EXIT_NOT_CONFIRMED."""
    if not typer.confirm(question, default=False):
        raise typer.Exit(code=EXIT_NOT_CONFIRMED)


def print_plan(h: HostConfig, plan: Plan, opts: DeployOptions, asked: Asked) -> None:
    """The plan's steps and the gate's rules; under --yes on a terminal only its head (nobody reads it first)."""
    from . import progress

    described = plan.describe()
    if asked.yes and not (asked.dry_run or asked.verbose or progress.plain_wanted(console, asked.plain)):
        # On a terminal nobody reads it before it runs: its head, and where the rest is (a log keeps it whole).
        described = [f"{described[0]}: {len(plan.steps)} steps (--dry-run or --verbose prints them)"]
    for line in described:
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    if not opts.no_restart and len(described) > 1:
        console.print(_gate_rules(h), highlight=False, style="dim", soft_wrap=True)


app = typer.Typer()
app.command("deploy", epilog=DEPLOY_EXIT_CODES)(common.bounded(deploy_command))
