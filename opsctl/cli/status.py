"""``opsctl status``: unit state, releases, last verdict and restart times, lock, disk, the latest parity lines."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

import typer

from ..errors import OpsError, SshError
from ..gate.decision import Judgement
from ..host import views
from ..host.history import HistoryRecord
from ..host.releaseroot import HostSnapshot
from ..inventory import HostConfig
from ..lock import hostlock
from ..pipeline.result import RestartTimes, describe_restart_times, last_restart_times
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


@dataclass(frozen=True)
class _Parity:
    """The running invocation's parity lines as the gate judges them."""

    latest: list[Judgement]  # the newest counted line of each rank and layer
    counted: int
    ignored: int  # not evidence: no or wrong token, or the marker inside another message

    @classmethod
    def judged(cls, h: HostConfig, view: views.StatusView) -> _Parity:
        line_judge = LineJudge(h, view.token)
        judged = [j for j in map(line_judge.message, view.parity_messages) if j is not None]
        evidence = counted(judged)
        return cls(latest_per_rank_and_layer(evidence), len(evidence), len(judged) - len(evidence))

    def to_json(self) -> list[dict[str, Any]]:
        return [
            {"layer": p.layer, "rank": p.rank, "rel": p.rel, "max_abs_diff": p.max_abs_diff, "verdict": j.verdict}
            for j in self.latest
            if (p := j.line) is not None
        ]


def _status_one(h: HostConfig, as_json: bool) -> dict[str, Any]:
    """Read one host's state; print it for people unless ``as_json``; return the JSON document."""
    view = views.read_status(h)
    snap, hist = view.snap, view.history
    parity = _Parity.judged(h, view)
    last = next((x for x in reversed(hist) if x.verdict is not None), None)
    restart_times = last_restart_times(hist)
    doc = {
        "host": h.name,
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
        "parity": parity.to_json(),
    }
    if not as_json:
        _print_state(h, snap, last, restart_times, doc["lock"])
        _print_parity(parity)
    return doc


def _print_state(
    h: HostConfig,
    snap: HostSnapshot,
    last: HistoryRecord | None,
    restart_times: RestartTimes | None,
    lock: str | None,
) -> None:
    unit_style = "green" if snap.unit.active_state == "active" else "red"
    console.print(
        f"[bold]{h.name}[/] ({h.target}) unit {h.unit}: [{unit_style}]{snap.unit.active_state}/{snap.unit.sub_state}[/] restarts={snap.unit.n_restarts}"
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
    console.print(f"lock: {lock or 'free'}   free disk: {snap.free_mb} MB", highlight=False)


def _print_parity(parity: _Parity) -> None:
    if parity.counted:
        console.print(
            parity_table(parity.latest, title="latest parity line of each rank and layer (current invocation)")
        )
    else:
        console.print("no parity lines from the current invocation yet")
    if parity.ignored:
        console.print(
            f"{parity.ignored} marked line(s) of the current invocation IGNORED, as the gate ignores them (no or "
            "wrong token=, or the marker inside another message): `opsctl logs --grep parity` shows them",
            style="yellow",
            highlight=False,
        )


app = typer.Typer()
app.command("status")(common.bounded(status_command))
