"""CLI: `opsctl health HOST|GROUP|--all` and `opsctl schedule install|remove|status`.

Thin: parse options, call opsctl.health (checks, probe, alerts, schedule), print. Exit codes of `health`: 0 OK,
1 WARN, 2 CRIT, 3 the check itself failed (bad inventory or option, a crash, an alert state that could not be saved).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from .. import inventory as inv
from ..errors import OpsError, UsageError
from ..health import alerts, schedule
from ..health.checks import check_hosts
from ..health.levels import EXIT_HEALTH_ERROR, HealthRun, Level
from ..health.localstate import HealthHistory, write_atomic
from ..health.probe import ssh_probe
from ..terminal import escaped
from . import common, render

console = common.out
err_console = common.err


def _targets(inventory: inv.Inventory, target: str | None, all_hosts: bool) -> tuple[str, list[inv.HostConfig]]:
    if all_hosts and target:
        raise UsageError("give a HOST or GROUP, or --all, not both")
    name = "all" if all_hosts else common.pick_target(inventory, target, "health")
    return name, inventory.resolve(name)


def health_command(
    target: Annotated[
        str | None,
        typer.Argument(
            help="host or group (or 'all'; default: the inventory's `default`, else its only host)", show_default=False
        ),
    ] = None,
    all_hosts: Annotated[bool, typer.Option("--all", help="every host of the inventory")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    prometheus: Annotated[
        Path | None, typer.Option("--prometheus", help="also write a node_exporter textfile here (atomically)")
    ] = None,
    rollback_on_fail: Annotated[
        bool,
        typer.Option(
            "--rollback-on-fail",
            help="roll back hosts whose release is CRIT (unit crash loop, HTTP down, parity failing)",
        ),
    ] = False,
    no_alerts: Annotated[bool, typer.Option("--no-alerts", help="do not run the inventory's alert hook")] = False,
    probe: Annotated[
        bool | None,
        typer.Option(
            "--probe/--no-probe",
            help="send one probe request through the service's API and require fresh parity lines from every rank "
            "(the verify path end to end; default: the host's health.probe, off unless set)",
        ),
    ] = None,
    inventory_path: common.InventoryOption = None,
    accept_new_host_key: common.AcceptNewHostKeyOption = False,
) -> None:
    """Check hosts: unit, HTTP, GPU, drift, parity, disk, lock; with --probe the verify path end to end. Exit 0 OK,
    1 WARN, 2 CRIT, 3 the check failed."""
    inventory = common.inventory(inventory_path, accept_new_host_key=accept_new_host_key)
    secrets = alerts.webhook_secrets(inventory.hosts.values())
    try:
        _health(inventory, target, all_hosts, as_json, prometheus, rollback_on_fail, no_alerts, probe)
    except (typer.Exit, typer.TyperException, typer.Abort):
        raise
    except OpsError as e:  # any message may quote a webhook URL: scrub it before the boundary prints it
        e.message = alerts.redact(e.message, secrets)
        raise
    except Exception as e:  # a bug: reported by the boundary, as redacted as the rest
        raise HealthCheckFailed(alerts.redact(f"{type(e).__name__}: {e}", secrets)) from e


class HealthCheckFailed(OpsError):
    """The health check itself could not run to its end (not a finding about a host)."""

    exit_code = EXIT_HEALTH_ERROR


def _health(
    inventory: inv.Inventory,
    target: str | None,
    all_hosts: bool,
    as_json: bool,
    prometheus: Path | None,
    rollback_on_fail: bool,
    no_alerts: bool,
    probe: bool | None = None,
) -> None:
    name, hosts = _targets(inventory, target, all_hosts)
    t0 = time.monotonic()
    run = check_hosts(
        hosts,
        lambda h: ssh_probe(h, probe=h.health.probe if probe is None else probe),
        HealthHistory(),
    )
    elapsed = time.monotonic() - t0
    if prometheus is not None:
        write_atomic(prometheus, render.render_prometheus(run.results))
        # On stderr: stdout stays one JSON document under --json.
        err_console.print(
            f"wrote {prometheus} ({len(run.results)} host(s), node_exporter textfile format)",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )
    deliveries: list[alerts.Delivery] = []
    alert_failure = None
    try:
        deliveries = [] if no_alerts else alerts.notify(inventory.hosts, run.results)
    except Exception as e:  # e.g. the alert state not writable: roll back first, then fail the run
        alert_failure = f"alert hook failed: {type(e).__name__}: {e}"
    # Rollbacks do not depend on the alerts: a failed delivery (or alert state) never stops one.
    rollbacks = _rollback(hosts, run, as_json) if rollback_on_fail else []
    if as_json:
        doc = render.to_json(run.results)
        doc["target"] = name
        doc["elapsed_s"] = round(elapsed, 3)
        doc["alerts"] = [{"host": d.alert.host, "to": d.target, "ok": d.ok, "error": d.error} for d in deliveries]
        doc["rollbacks"] = rollbacks
        if alert_failure:
            doc["error"] = alerts.redact(alert_failure, alerts.webhook_secrets(inventory.hosts.values()))
            doc["exit_code"] = EXIT_HEALTH_ERROR
        common.emit_json(doc)
    else:
        console.print(render.render_table(run.results))
        for line in render.details(run.results):
            console.print(line, style="yellow" if " WARN:" in line else "red", highlight=False, markup=False)
        for d in deliveries:
            if not d.ok:
                err_console.print(
                    escaped(f"alert for {d.alert.host} not delivered ({d.target}): {d.error}"),
                    style="red",
                    markup=False,
                )
            elif d.target != "none":
                console.print(escaped(f"alert sent ({d.target}): {d.alert.summary}"), highlight=False, markup=False)
        verdict = ["OK", "WARN", "CRIT"][run.exit_code]
        console.print(
            f"health {name}: {verdict} ({len(run.results)} host(s) in {elapsed:.2f}s)",
            style=["green", "yellow", "bold red"][run.exit_code],
        )
    if alert_failure:
        if as_json:  # the document above carries the error; stdout stays one JSON document
            common.err.print(f"[bold red]error:[/] [red]{escape(alert_failure)}[/]", soft_wrap=True)
            raise typer.Exit(EXIT_HEALTH_ERROR)
        raise HealthCheckFailed(alert_failure)
    raise typer.Exit(run.exit_code)


def _rollback(hosts: list[inv.HostConfig], run: HealthRun, quiet: bool) -> list[dict[str, object]]:
    """Roll back each host whose release checks are CRIT, one at a time, through the single-host pipeline."""
    from .. import pipeline

    by_name = {h.name: h for h in hosts}
    out: list[dict[str, object]] = []
    for r in run.results:
        if not r.wants_rollback:
            continue
        if not quiet:
            console.print(
                f"{r.host}: CRIT on {', '.join(c.name for c in r.checks if c.level is Level.CRIT)}: rolling back"
            )
        try:
            res = pipeline.rollback(by_name[r.host])
            out.append({"host": r.host, "ok": res.ok, "release": res.release, "verdict": res.verdict})
            if not quiet:
                console.print(escaped(res.line()), style="green" if res.ok else "red", highlight=False, markup=False)
        except OpsError as e:
            out.append({"host": r.host, "ok": False, "error": e.message})
            if not quiet:
                err_console.print(escaped(f"{r.host}: rollback failed: {e.message}"), style="red", markup=False)
    return out


schedule_app = typer.Typer(help="Scheduled health checks (systemd timer on this machine).", no_args_is_help=True)


def _user_mode(user: bool | None) -> bool:
    return schedule.default_user_mode() if user is None else user


UserOpt = Annotated[
    bool | None,
    typer.Option("--user/--system", help="user or system systemd instance (default: --user unless root)"),
]


@schedule_app.command("install")
@common.bounded
def schedule_install(
    target: Annotated[str, typer.Argument(help="host or group the timer checks")] = "all",
    prometheus: Annotated[Path | None, typer.Option("--prometheus", help="textfile the check writes")] = None,
    rollback_on_fail: Annotated[
        bool,
        typer.Option(
            "--rollback-on-fail",
            help="each timed check rolls back hosts whose release is CRIT (unit crash loop, HTTP down, parity "
            "failing) to their last good release, as `opsctl health --rollback-on-fail` does",
        ),
    ] = False,
    user: UserOpt = None,
    inventory_path: common.InventoryOption = None,
) -> None:
    """Install and start opsctl-health.timer (OnCalendar/RandomizedDelaySec from the inventory)."""
    inventory = common.inventory(inventory_path)
    spec = schedule.make_spec(
        inventory.resolve(target),
        target=target,
        inventory=inventory.path,
        prometheus=prometheus,
        rollback_on_fail=rollback_on_fail,
    )
    res = schedule.install(spec, user=_user_mode(user))
    console.print(res.message, highlight=False)
    for p in res.files:
        console.print(f"  {p}", highlight=False)


@schedule_app.command("remove")
@common.bounded
def schedule_remove(user: UserOpt = None) -> None:
    """Stop, disable and delete the opsctl-health timer and service."""
    console.print(schedule.remove(user=_user_mode(user)).message, highlight=False)


@schedule_app.command("status")
@common.bounded
def schedule_status(
    user: UserOpt = None,
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """Whether the timer is installed and active, when it runs next, and the last health result per host."""
    st = schedule.status(user=_user_mode(user))
    last = HealthHistory().latest()
    if as_json:
        common.emit_json({**st.to_dict(), "last": {h: rec.get("status") for h, rec in last.items()}})
        return
    console.print(f"units in {st.unit_dir}: {'installed' if st.installed else 'not installed'}", highlight=False)
    if st.exec_start:
        console.print(f"  runs: {st.exec_start}", highlight=False)
    if st.timer:
        console.print(
            f"  timer: {st.timer.get('ActiveState', '?')}, next {st.timer.get('NextElapseUSecRealtime') or '-'}, "
            f"last {st.timer.get('LastTriggerUSec') or '-'}",
            highlight=False,
        )
    if st.service:
        console.print(
            f"  last run: {st.service.get('Result', '?')} (exit {st.service.get('ExecMainStatus', '?')})",
            highlight=False,
        )
    for host, rec in sorted(last.items()):
        console.print(f"  {host}: {str(rec.get('status', '?')).upper()} at {time.ctime(rec.get('checked_at', 0))}")


app = typer.Typer()
app.command("health")(common.bounded_failing_with(EXIT_HEALTH_ERROR)(health_command))
common.FAILURE_EXIT["health"] = EXIT_HEALTH_ERROR
