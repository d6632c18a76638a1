"""A group target of ``deploy`` or ``rollback``: show the plan, ask, run it through opsctl.fleet.rollout, print the
per-host table (the CLI side of opsctl/fleet/rollout.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import typer

from ..errors import EXIT_NOT_CONFIRMED, GateFailed
from . import common

if TYPE_CHECKING:
    from ..fleet import rollout as fleet

console = common.out


def run_fleet(
    target: str,
    plan: fleet.RolloutPlan,
    make_action: Callable[[fleet.Progress], fleet.Action],
    what: str,
    parallel: bool,
    dry_run: bool,
    yes: bool,
    as_json: bool,
) -> None:
    """A group target: show the plan, ask, run it through opsctl.fleet.rollout, print the per-host table."""
    from ..fleet import rollout as fleet
    from . import render as cli_render

    if not as_json:
        console.print(f"{what} {target}: {plan.describe()}", highlight=False, soft_wrap=True)
    if dry_run:
        if as_json:
            common.emit_json(
                {"target": target, "plan": [[name, [h.name for h in stage]] for name, stage in plan.stages]}
            )
        return
    if not yes and not typer.confirm(f"{what} {plan.total} host(s) of {target}?", default=False):
        raise typer.Exit(code=EXIT_NOT_CONFIRMED)

    def emit(msg: str) -> None:
        if not as_json:
            console.print(msg, highlight=False, markup=False, soft_wrap=True)

    report = fleet.run_rollout(plan, make_action(emit), parallel=parallel, progress=emit)
    if as_json:
        common.emit_json({"target": target, "ok": report.ok, "stopped": report.stopped, "outcomes": report.outcomes})
    else:
        console.print(cli_render.render_report(report, title=f"{what} {target}"))
        console.print(cli_render.summary_line(report), style="bold green" if report.ok else "bold red", highlight=False)
    if not report.ok:
        raise typer.Exit(code=GateFailed.exit_code)
