"""``opsctl status``: unit state, releases, last verdict and restart times, lock, disk, the latest parity lines."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ..errors import OpsError, SshError
from ..host import views as hostinfo
from ..inventory import HostConfig
from ..lock import hostlock
from ..pipeline.result import describe_restart_times, last_restart_times
from . import common
from .parityview import LineJudge, counted, latest_per_rank_and_layer, parity_table, verdict_style

console = common.out


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
    snap, hist = view.snap, view.history
    line_judge = LineJudge(h, view.token)
    judged = [j for j in map(line_judge.message, view.parity_messages) if j is not None]
    evidence = counted(judged)
    latest = latest_per_rank_and_layer(evidence)
    last = next((x for x in reversed(hist) if x.verdict is not None), None)
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
        "last_verdict": last.as_json() if last else None,
        "last_restart": restart_times,
        "lock": hostlock.describe_owner(snap.lock_owner) if snap.lock_present else None,
        "free_mb": snap.free_mb,
        "parity": [
            {
                "layer": j.line.layer,
                "rank": j.line.rank,
                "rel": j.line.rel,
                "max_abs_diff": j.line.max_abs_diff,
                "verdict": j.verdict,
            }
            for j in latest
            if j.line is not None
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
    if last and last.verdict:
        console.print(
            f"last verdict: [{verdict_style(last.verdict)}]{last.verdict}[/] ({last.event} {last.release} at {last.at})",
            highlight=False,
        )
    if restart_times:
        console.print(f"last restart: {describe_restart_times(restart_times)}", highlight=False)
    console.print(f"lock: {doc['lock'] or 'free'}   free disk: {snap.free_mb} MB", highlight=False)
    if evidence:
        console.print(parity_table(latest, title="latest parity line of each rank and layer (current invocation)"))
    else:
        console.print("no parity lines from the current invocation yet")
    ignored = len(judged) - len(evidence)
    if ignored:
        console.print(
            f"{ignored} marked line(s) of the current invocation IGNORED, as the gate ignores them (no or wrong "
            "token=, or the marker inside another message): `opsctl logs --grep parity` shows them",
            style="yellow",
            highlight=False,
        )
    return doc


app = typer.Typer()
app.command("status")(common.bounded(status_command))
