"""CLI: deploy, restart, service, rollback, releases, status, logs, lock, adopt (one host each).

Thin: parse options, call opsctl.pipeline / hoststate / journal, render with rich. Errors are OpsErrors (the CLI
boundary prints one red line and exits with their code). Exit 0 only when the action succeeded (a deploy: PASS).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress, ProgressColumn, SpinnerColumn, Task, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from .. import pipeline
from ..errors import (
    EXIT_LOCK_HELD,
    EXIT_NOT_CONFIRMED,
    EXIT_UNIT_INACTIVE,
    DeployFailed,
    GateFailed,
    OpsError,
    SshError,
    UsageError,
)
from ..fleet import rollout as fleet
from ..gate.decision import classify
from ..gate.lines import FallbackLine, ParityLine, ShapesLine, parse_line
from ..host import history as host_history
from ..host import releaseroot as hs
from ..host import views as hostinfo
from ..inventory import HostConfig
from ..journal.follower import message_text
from ..lock import hostlock
from ..pipeline.result import describe_restart_times, last_restart_times
from ..release import default_tree
from . import common
from . import render as cli_render

console = common.out
VERDICT_STYLE = {
    "PASS": "bold green",
    "FAIL": "bold red",
    "INCONCLUSIVE": "yellow",
    "NODATA": "red",
    "ERROR": "bold red",
    "UNPROVEN": "yellow",
}


def _host(name: str | None, inventory_path: Path | None, command: str) -> HostConfig:
    """The host a single-host command acts on: the one named, else the inventory's default (announced)."""
    return common.pick_host(common.inventory(inventory_path), name, command)


# ------------------------------------------------------------------------------------------------ progress


class _Seconds(ProgressColumn):
    """Elapsed time of a step with a tenth of a second (steps are often shorter than one)."""

    def render(self, task: Task) -> Text:
        elapsed = task.finished_time if task.finished else task.elapsed
        return Text(f"{elapsed or 0.0:6.1f}s", style="dim")


# A step whose detail starts with a verdict (the gate's "FAIL: reason") shows that outcome, not a green check.
_OUTCOME = re.compile(r"^(PASS|FAIL|NODATA|INCONCLUSIVE|ERROR|UNPROVEN)\b")
_SWITCH_TO = re.compile(r"current -> (\S+)")


class RichReporter:
    """One row per step with a spinner and its elapsed time; parity lines printed above as they arrive, each naming
    the release it belongs to: the new one (``new``, before the restart ``pre-restart``) or the rollback's.

    Not on a terminal (CI, a log file), nothing is redrawn: each step prints one line when it ends, in order with
    the parity lines."""

    def __init__(
        self, host: str, out: Console = console, *, release: str | None = None, action: str = "deploy"
    ) -> None:
        self.host = host
        self.release = release
        self.action = action
        self.label = f"{release} ({'new' if action == 'deploy' else action})" if release else ""
        self.progress = Progress(
            SpinnerColumn(finished_text=" "),
            TextColumn("{task.description}"),
            _Seconds(),
            console=out,
            transient=False,
        )
        self.tasks: dict[str, TaskID] = {}
        self.live = out.is_terminal
        self.out = out
        self.started: dict[str, float] = {}

    def __enter__(self) -> RichReporter:
        if self.live:
            self.progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live:
            self.progress.stop()

    def step(self, name: str, detail: str = "") -> None:
        switch = _SWITCH_TO.search(detail) if name in ("switch", "rollback") else None
        if name == "parity" and self.release:
            self.label = f"{self.release} (new, pre-restart)"
        elif switch and name == "rollback":
            self.label = f"{switch.group(1)} (rollback)"
        elif switch:
            target = switch.group(1)
            self.label = f"{target} (new)" if target == self.release else f"{target} ({self.action})"
        self.started[name] = time.monotonic()
        if self.live:
            self.tasks[name] = self.progress.add_task(f"[bold]{name}[/] {_escape(detail)}".rstrip(), total=1)

    def _finish(self, name: str, mark: str, detail: str) -> None:
        desc = f"{mark} [bold]{name}[/]" + (f" [dim]{_escape(detail)}[/]" if detail else "")
        if not self.live:
            if name in self.started:
                secs = time.monotonic() - self.started.pop(name)
                self.out.print(f"  {desc} [dim]({secs:.1f}s)[/]", highlight=False, soft_wrap=True)
            return
        task = self.tasks.get(name)
        if task is None:
            return
        self.progress.update(task, description=desc, completed=1)
        self.progress.stop_task(task)

    def done(self, name: str, detail: str = "") -> None:
        outcome = _OUTCOME.match(detail)
        if outcome and outcome.group(1) != "PASS":
            self._finish(name, "[red]✗[/]", detail)
        else:
            self._finish(name, "[green]✓[/]", detail)

    def failed(self, name: str, detail: str = "") -> None:
        self._finish(name, "[red]✗[/]", detail)

    def info(self, message: str) -> None:
        self.progress.console.print(f"[yellow]{_escape(message)}[/]")

    def parity(self, line: ParityLine, verdict: str) -> None:
        rank = f" TP{line.rank}" if line.rank is not None else ""
        style = VERDICT_STYLE.get(verdict, "")
        label = f" {_escape(self.label)}" if self.label else ""
        self.progress.console.print(
            f"  parity{label} L{line.layer}{rank} rel={_fmt(line.rel)} max_abs_diff={_fmt(line.max_abs_diff)} [{style}]{verdict}[/]",
            highlight=False,
        )


def _escape(text: str) -> str:
    return text.replace("[", "\\[")


def _fmt(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else str(x)


def _verdict_line(res: pipeline.DeployResult) -> None:
    style = "bold green" if res.ok else "bold red"
    console.print(Text(res.line(), style=style))


def _json_result(res: pipeline.DeployResult) -> dict[str, Any]:
    return {
        "host": res.host,
        "action": res.action,
        "release": res.release,
        "verdict": res.verdict,
        "ok": res.ok,
        "reason": res.reason,
        "current": res.current_after,
        "rolled_back_to": res.rolled_back_to,
        "rollback_verdict": res.rollback_verdict,
        "gate": res.gate,
        "bytes_sent": res.bytes_sent,
        "step_times_s": {k: round(v, 3) for k, v in res.step_times.items()},
        "elapsed_s": round(res.elapsed_s, 3),
    }


@contextlib.contextmanager
def _reporter(
    host: str, quiet: bool, *, release: str | None = None, action: str = "deploy"
) -> Iterator[pipeline.Reporter]:
    if quiet:
        yield pipeline.NullReporter()
        return
    with RichReporter(host, release=release, action=action) as rep:
        yield rep


def _finish(res: pipeline.DeployResult, as_json: bool) -> None:
    if as_json:
        common.emit_json(_json_result(res))
    else:
        _verdict_line(res)
    if not res.ok:
        raise typer.Exit(code=res.verdict.exit_code)


# ------------------------------------------------------------------------------------------------ fleet


def _run_fleet(
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
    if not as_json:
        console.print(f"{what} {target}: {plan.describe()}", highlight=False)
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
            console.print(msg, highlight=False, markup=False)

    report = fleet.run_rollout(plan, make_action(emit), parallel=parallel, progress=emit)
    if as_json:
        common.emit_json({"target": target, "ok": report.ok, "stopped": report.stopped, "outcomes": report.outcomes})
    else:
        console.print(cli_render.render_report(report, title=f"{what} {target}"))
        console.print(cli_render.summary_line(report), style="bold green" if report.ok else "bold red", highlight=False)
    if not report.ok:
        raise typer.Exit(code=GateFailed.exit_code)


# ------------------------------------------------------------------------------------------------ commands


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
    inventory_path: common.InventoryOption = None,
) -> None:
    """Deploy the working tree to HOST (or a GROUP, canary first then batches): upload, build, parity, switch,
    restart, gate; each host rolls itself back on failure. The plan is printed when there is work to do."""
    tree = (src or default_tree()).resolve()
    inv = common.inventory(inventory_path)
    host = common.pick_target(inv, host, "deploy")
    if host not in inv.hosts:
        targets = inv.resolve(host)
        plan = fleet.plan_rollout(
            targets, canary=canary or fleet.default_canary(targets), batch=batch, max_fail=max_fail
        )
        opts = pipeline.DeployOptions(
            gate_timeout_s=gate_timeout, force=force, no_restart=no_restart, skip_prerestart_parity=skip_parity
        )
        _run_fleet(
            host, plan, lambda emit: fleet.deploy_action(tree, opts, emit), "deploy", parallel, dry_run, yes, as_json
        )
        return
    if canary or batch or max_fail or parallel:
        raise UsageError(f"{host} is a single host: --canary, --batch, --max-fail and --parallel are for groups")
    h = inv.host(host)
    opts = pipeline.DeployOptions(
        dry_run=True,
        gate_timeout_s=gate_timeout,
        force=force,
        no_restart=no_restart,
        skip_prerestart_parity=skip_parity,
    )
    plan_res = pipeline.deploy(h, tree, opts)
    if plan_res.plan is not None and plan_res.verdict is pipeline.DeployVerdict.PLANNED and not as_json:
        for line in plan_res.plan.describe():
            console.print(line, highlight=False)
        if not no_restart:
            console.print(_gate_rules(h), highlight=False, style="dim", soft_wrap=True)
    if plan_res.verdict is pipeline.DeployVerdict.REFUSED and dry_run:
        raise DeployFailed(f"deploy would be refused: {plan_res.reason}")
    if dry_run or plan_res.verdict is pipeline.DeployVerdict.UP_TO_DATE:
        _finish(plan_res, as_json)
        return
    # A refusal is raised by the real run below with its own type (LockHeld, DeployFailed): no question first.
    if (
        plan_res.verdict is not pipeline.DeployVerdict.REFUSED
        and not yes
        and not typer.confirm(f"Deploy {plan_res.release} to {host}?", default=False)
    ):
        raise typer.Exit(code=EXIT_NOT_CONFIRMED)
    real = pipeline.DeployOptions(
        gate_timeout_s=gate_timeout, force=force, no_restart=no_restart, skip_prerestart_parity=skip_parity
    )
    with _reporter(host, as_json, release=plan_res.release) as rep:
        res = pipeline.deploy(h, tree, real, rep)
    _finish(res, as_json)


def _confirm_restart(yes: bool, question: str) -> None:
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
    h = _host(host, inventory_path, "restart")
    host = h.name
    _confirm_restart(yes, f"Restart {h.unit} on {host} (the model loads again) and gate it?")
    with _reporter(host, as_json, action="restart") as rep:
        res = pipeline.restart(h, rep, rollback_on_fail=rollback_on_fail, gate_timeout_s=gate_timeout)
    if not res.ok and not rollback_on_fail and not as_json:
        console.print(
            f"the gate did not pass; the release stays current. Decide: `opsctl rollback {host}` or investigate with `opsctl logs {host} --grep parity`",
            style="yellow",
        )
    _finish(res, as_json)


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
    inv = common.inventory(inventory_path)
    host = common.pick_target(inv, host, "rollback")
    if host not in inv.hosts:
        if to is not None:
            raise UsageError("--to names one release of one host; roll a group back to each host's last good release")
        plan = fleet.plan_rollout(inv.resolve(host), max_fail="100%")  # every host is tried: a rollback is a repair
        kwargs = {"force": force, "gate": not no_gate, "gate_timeout_s": gate_timeout}
        _run_fleet(
            host, plan, lambda emit: fleet.rollback_action(emit, **kwargs), "rollback", parallel, False, yes, as_json
        )
        return
    h = inv.host(host)
    _confirm_restart(yes, f"Roll {host} back to {to or 'its newest good release before current'} and restart it?")
    with _reporter(host, as_json, action="rollback") as rep:
        res = pipeline.rollback(h, rep, to=to, force=force, gate=not no_gate, gate_timeout_s=gate_timeout)
    _finish(res, as_json)


def adopt_command(
    host: common.HostArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    inventory_path: common.InventoryOption = None,
) -> None:
    """Record an existing hand-made install (files + unit) as release zero, without restarting anything."""
    h = _host(host, inventory_path, "adopt")
    host = h.name
    with _reporter(host, as_json) as rep:
        res = pipeline.adopt(h, rep)
    _finish(res, as_json)


def _host_and_action(
    host: str | None, action: str | None, actions: tuple[str, ...], inventory_path: Path | None, command: str
) -> tuple[HostConfig, str | None]:
    """`opsctl CMD [HOST] ACTION`: with the host left out, the one word given is the action."""
    inv = common.inventory(inventory_path)
    if action is None and host in actions and host not in inv.hosts and host not in inv.groups:
        host, action = None, host
    return common.pick_host(inv, host, command), action


def service_command(
    host: common.HostArg = None,
    action: Annotated[str | None, typer.Argument(help="start | stop | status", show_default=False)] = None,
    inventory_path: common.InventoryOption = None,
) -> None:
    """Start, stop or show the service unit (no gate: use `restart` for a gated restart)."""
    h, action = _host_and_action(host, action, hostinfo.SERVICE_ACTIONS, inventory_path, "service")
    host = h.name
    unit = h.unit + ".service"
    done = hostinfo.service(h, action)  # refuses an unknown action before connecting
    if action == "status":
        console.print(done.status_text, highlight=False, markup=False)
        raise typer.Exit(code=0 if done.status_rc == 0 else EXIT_UNIT_INACTIVE)
    state = done.state
    console.print(
        f"{host}: {unit} {action} -> {state}", style="green" if (state == "active") == (action == "start") else "red"
    )


def releases_command(
    host: common.HostArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the releases as JSON")] = False,
    inventory_path: common.InventoryOption = None,
) -> None:
    """List the releases on HOST: id, created, commit, current/good/bad, last verdict."""
    h = _host(host, inventory_path, "releases")
    host = h.name
    view = hostinfo.read_releases(h)
    snap, hist, info = view.snap, view.history, view.meta
    verdicts = host_history.release_verdicts(hist)
    rows = []
    for rid in sorted(snap.releases, key=lambda x: snap.releases[x], reverse=True):
        flags = [
            f
            for f, on in (
                ("current", rid == snap.current),
                ("last-good", rid == snap.last_good),
                ("bad", rid in snap.bad),
                ("adopted", rid.startswith("r0-")),
            )
            if on
        ]
        v = verdicts.get(rid, {})
        rows.append(
            {
                "id": rid,
                "created": info.get(rid, {}).get("created_at", "?"),
                "commit": info.get(rid, {}).get("commit"),
                "dirty": info.get(rid, {}).get("dirty"),
                "flags": flags,
                "verdict": v.get("verdict"),
                "verdict_at": v.get("at"),
            }
        )
    if as_json:
        common.emit_json(rows)
        return
    table = Table(title=f"releases on {host} ({h.root})")
    for col in ("id", "created", "commit", "state", "last verdict"):
        table.add_column(col)
    for row in rows:
        commit = (row["commit"] or "-")[:10] + ("+dirty" if row["dirty"] else "")
        verdict = row["verdict"] or "-"
        table.add_row(
            row["id"],
            row["created"],
            commit,
            ", ".join(row["flags"]),
            Text(verdict, style=VERDICT_STYLE.get(verdict, "")),
        )
    console.print(table)


def status_command(
    host: common.TargetArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the state as JSON")] = False,
    inventory_path: common.InventoryOption = None,
) -> None:
    """Unit state, current release, last verdict, last parity figures, lock (of a host, or each host of a group)."""
    inv = common.inventory(inventory_path)
    host = common.pick_target(inv, host, "status")
    if host in inv.hosts:
        doc = _status_one(inv.host(host), as_json)
        if as_json:
            common.emit_json(doc)
        return
    docs: list[dict[str, Any]] = []
    failed = 0
    for h in inv.resolve(host):
        try:
            docs.append(_status_one(h, as_json))
        except OpsError as e:  # one unreachable host must not hide the others
            failed += 1
            docs.append({"host": h.name, "error": e.message})
            if not as_json:
                common.report_error(e)
        if not as_json:
            console.print()
    if as_json:
        common.emit_json(docs)
    if failed:
        raise typer.Exit(code=SshError.exit_code)


def _status_one(h: HostConfig, as_json: bool) -> dict[str, Any]:
    """Read one host's state; print it for people unless ``as_json``; return the JSON document."""
    host = h.name
    view = hostinfo.read_status(h)
    snap, hist, parity = view.snap, view.history, view.parity
    latest = view.latest_parity()
    last = next((x for x in reversed(hist) if x.get("verdict")), None)
    restart_times = last_restart_times(hist)
    doc = {
        "host": host,
        "managed": snap.is_managed,
        "unit": {
            "name": h.unit,
            "load": snap.unit.load_state,
            "active": snap.unit.active_state,
            "sub": snap.unit.sub_state,
            "restarts": snap.unit.n_restarts,
        },
        "current": snap.current,
        "last_good": snap.last_good,
        "bad": sorted(snap.bad),
        "last_verdict": last,
        "last_restart": restart_times,
        "lock": hostlock.describe_owner(snap.lock_owner) if snap.lock_present else None,
        "free_mb": snap.free_mb,
        "parity": [
            {
                "layer": p.layer,
                "rank": p.rank,
                "rel": _json_num(p.rel),
                "max_abs_diff": _json_num(p.max_abs_diff),
                "verdict": str(classify(p, h.gate)),
            }
            for p in latest
        ],
    }
    if as_json:
        return doc
    unit_style = "green" if snap.unit.active_state == "active" else "red"
    console.print(
        f"[bold]{host}[/] ({h.target}) unit {h.unit}: [{unit_style}]{snap.unit.active_state}/{snap.unit.sub_state}[/] restarts={snap.unit.n_restarts}"
    )
    console.print(
        f"current release: [bold]{snap.current or 'none'}[/]  last good: {snap.last_good or 'none'}  bad: {', '.join(sorted(snap.bad)) or 'none'}"
    )
    if not snap.is_managed:
        console.print("[yellow]not managed by opsctl (adopt or deploy first)[/]")
    if last:
        v = str(last.get("verdict"))
        console.print(
            f"last verdict: [{VERDICT_STYLE.get(v, '')}]{v}[/] ({last.get('event')} {last.get('release')} at {last.get('at')})",
            highlight=False,
        )
    if restart_times:
        console.print(f"last restart: {describe_restart_times(restart_times)}", highlight=False)
    console.print(f"lock: {doc['lock'] or 'free'}   free disk: {snap.free_mb} MB", highlight=False)
    if parity:
        console.print(_parity_table(latest, h, title="latest parity line of each rank and layer (current invocation)"))
    else:
        console.print("no parity lines from the current invocation yet")
    return doc


def _json_num(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def _parity_table(lines: list[ParityLine], h: HostConfig, title: str = "", times: list[str] | None = None) -> Table:
    table = Table(title=title or None)
    if times:
        table.add_column("time")
    for col in ("rank", "layer", "max_abs_diff", "mean", "rel", "verdict"):
        table.add_column(col, justify="right" if col not in ("verdict",) else "left")
    for i, p in enumerate(lines):
        v = str(classify(p, h.gate))
        row = [
            f"TP{p.rank}" if p.rank is not None else "-",
            f"L{p.layer}",
            _fmt(p.max_abs_diff),
            _fmt(p.mean),
            _fmt(p.rel),
            Text(v, style=VERDICT_STYLE.get(v, "")),
        ]
        table.add_row(*([times[i]] if times else []), *row)
    return table


def logs_command(
    host: common.HostArg = None,
    grep: Annotated[str | None, typer.Option("--grep", help="shapes | parity | a regular expression")] = None,
    follow: Annotated[bool, typer.Option("--follow", "-f", help="keep printing new lines")] = False,
    since: Annotated[
        str | None, typer.Option("--since", help="journalctl time, e.g. '10 min ago' or '2026-05-31 13:00'")
    ] = None,
    lines: Annotated[int, typer.Option("--lines", "-n", help="how many recent lines (without --since)")] = 200,
    as_json: Annotated[bool, typer.Option("--json", help="one JSON object per line")] = False,
    inventory_path: common.InventoryOption = None,
) -> None:
    """The unit's journal; parity lines as a coloured table, shapes lines decoded."""
    h = _host(host, inventory_path, "logs")
    host = h.name
    matcher = _matcher(grep)
    printer = _LogPrinter(h, as_json, stream=follow)
    hostinfo.read_journal(
        h,
        lambda line: printer.feed(line, matcher),
        since=since,
        lines=lines,
        follow=follow,
        kdtree_only=grep in ("shapes", "parity"),
    )
    printer.flush()
    if not printer.matched and not follow:
        window = f"since {since}" if since else f"in the last {lines} lines"
        what = f"matched --grep {grep}" if grep else "was found"
        (common.err if as_json else console).print(
            f"{host}: no journal line of {h.unit}.service {what} ({window}; read {printer.read} lines)",
            style="yellow",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


def _matcher(grep: str | None) -> Callable[[str, Any], bool]:
    if grep is None:
        return lambda _msg, _rec: True
    if grep == "shapes":
        return lambda _msg, rec: isinstance(rec, ShapesLine)
    if grep == "parity":
        return lambda _msg, rec: isinstance(rec, ParityLine)
    try:
        rx = re.compile(grep)
    except re.error as e:
        raise UsageError(f"--grep {grep!r} is not a valid regular expression: {e}") from None
    return lambda msg, _rec: bool(rx.search(msg))


class _LogPrinter:
    def __init__(self, h: HostConfig, as_json: bool, stream: bool) -> None:
        self.h, self.as_json, self.stream = h, as_json, stream
        self.read = 0  # journal entries read
        self.matched = 0  # of those, shown
        self.parity: list[ParityLine] = []
        self.parity_times: list[str] = []

    def feed(self, raw: str, matcher: Callable[[str, Any], bool]) -> None:
        try:
            doc = json.loads(raw)
        except ValueError:
            return
        self.read += 1
        msg = message_text(doc.get("MESSAGE"))
        when = _fmt_time(doc.get("__REALTIME_TIMESTAMP"))
        rec = parse_line(msg)
        if not matcher(msg, rec):
            return
        self.matched += 1
        if self.as_json:
            sys.stdout.write(json.dumps(_log_json(when, msg, rec, self.h), default=str) + "\n")
            sys.stdout.flush()
        elif isinstance(rec, ParityLine) and not console.is_terminal:
            # Piped: the entry as `journalctl -o short-iso` prints it, so `opsctl parity check -` reads it as the
            # journal itself (the table below is for a terminal).
            # A newline (never in a stdout line; possible from another writer) would make a second line out of
            # the message's middle: U+FFFD keeps it one line, and a marked message with it stays malformed.
            one_line = msg.replace("\n", "\ufffd")
            when = _iso_time(doc.get("__REALTIME_TIMESTAMP"))
            console.file.write(f"{when} {self.h.name} {self.h.unit}: {one_line}\n")
            if self.stream:
                console.file.flush()
        elif isinstance(rec, ParityLine):
            if self.stream:
                v = str(classify(rec, self.h.gate))
                rank = f"TP{rec.rank} " if rec.rank is not None else ""
                console.print(
                    f"{when} {rank}L{rec.layer} max_abs_diff={_fmt(rec.max_abs_diff)} mean={_fmt(rec.mean)} rel={_fmt(rec.rel)} [{VERDICT_STYLE.get(v, '')}]{v}[/]",
                    highlight=False,
                )
            else:
                self.parity.append(rec)
                self.parity_times.append(when)
        elif isinstance(rec, ShapesLine):
            d = rec.decode()
            rank = f"TP{rec.rank} " if rec.rank is not None else ""
            console.print(
                f"{when} {rank}[bold]shapes[/] " + _escape(" ".join(f"{k}={v}" for k, v in rec.fields.items())),
                highlight=False,
            )
            console.print(f"    {_escape(d.text())}", style="cyan", highlight=False)
            if d.warning:
                console.print(f"    {_escape(d.warning)}", style="bold red", highlight=False)
        else:
            console.print(f"{when} {msg}", highlight=False, markup=False)

    def flush(self) -> None:
        if self.parity:
            console.print(_parity_table(self.parity, self.h, title="parity", times=self.parity_times))


def _iso_time(us: Any) -> str:
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(int(us) / 1e6))
    except (TypeError, ValueError):
        return "1970-01-01T00:00:00+0000"


def _fmt_time(us: Any) -> str:
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(int(us) / 1e6))
    except (TypeError, ValueError):
        return "?"


def _log_json(when: str, msg: str, rec: Any, h: HostConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"time": when, "message": msg}
    if isinstance(rec, ParityLine):
        out.update(
            kind="parity",
            layer=rec.layer,
            rank=rec.rank,
            max_abs_diff=_json_num(rec.max_abs_diff),
            mean=_json_num(rec.mean),
            rel=_json_num(rec.rel),
            extra=rec.extra,
            verdict=str(classify(rec, h.gate)),
        )
    elif isinstance(rec, ShapesLine):
        d = rec.decode()
        out.update(kind="shapes", rank=rec.rank, fields=rec.fields, decoded=d.text(), warning=d.warning)
    elif isinstance(rec, FallbackLine):
        out.update(kind="fallback", rank=rec.rank, fields=rec.fields)
    else:
        out["kind"] = "log"
    return out


def lease_text(snap: hs.HostSnapshot) -> str:
    """How long the holder's lease still runs (it renews it while alive), or why the lock may be taken over."""
    left = snap.lock_remaining_s
    rebooted = bool(snap.lock_boot_id) and snap.lock_boot_id != snap.boot_id
    if rebooted:
        return " (stale: taken before the host last booted; the next deploy takes it over)"
    if left is None:
        return ""
    if left <= 0:
        return f" (lease expired {-left:.0f}s ago: its holder stopped renewing it; the next deploy takes it over)"
    return f", lease {left:.0f}s left (renewed while its holder runs)"


def lock_command(
    host: common.HostArg = None,
    action: Annotated[str | None, typer.Argument(help="status (default) | release", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="required by release: break someone else's lock")] = False,
    inventory_path: common.InventoryOption = None,
) -> None:
    """Show who holds the deploy lock of HOST, or break it (`release --force`, only when its owner is gone)."""
    h, action = _host_and_action(host, action, ("status", "release"), inventory_path, "lock")
    host = h.name
    action = action or "status"
    if action not in ("status", "release"):
        raise UsageError(f"lock action must be status or release, not {action!r}")
    if action == "release" and not force:
        raise UsageError("breaking a lock needs --force (check `opsctl lock HOST status` first: is its owner gone?)")
    snap = hostinfo.read_lock(h, break_it=action == "release")
    owner = hostlock.describe_owner(snap.lock_owner) + lease_text(snap)
    if action == "release":
        msg = f"{host}: broke the lock held by {owner}" if snap.lock_present else f"{host}: lock was already free"
        console.print(msg, style="yellow" if snap.lock_present else "green", highlight=False)
    elif snap.lock_present:
        console.print(f"{host}: locked by {owner}", style="yellow", highlight=False)
        raise typer.Exit(code=EXIT_LOCK_HELD)
    else:
        console.print(f"{host}: lock free", style="green")


_bounded = common.bounded


app = typer.Typer()
app.command("deploy", epilog=DEPLOY_EXIT_CODES)(_bounded(deploy_command))
app.command("restart")(_bounded(restart_command))
app.command("rollback")(_bounded(rollback_command))
app.command("adopt")(_bounded(adopt_command))
app.command("service")(_bounded(service_command))
app.command("releases")(_bounded(releases_command))
app.command("status")(_bounded(status_command))
app.command("logs")(_bounded(logs_command))
app.command("lock")(_bounded(lock_command))
