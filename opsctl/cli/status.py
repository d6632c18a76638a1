"""``opsctl status``: unit state, releases, last verdict and restart times, lock, disk, the latest parity lines.

It tells one story and a script can act on it (docs/exit-codes.md): exit 0 when the unit is active and no parity
line of the running invocation FAILs; 31 when one FAILs (the newest such line is named); 3 when the unit is not
active (as ``systemctl status``); 10 when a host of a group could not be read. The rules are the pure functions
``story`` (which history records the verdict and restart lines come from), ``bad_releases`` and ``exit_code``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ..terminal import escaped
from . import common
from .common import escape_brackets

if TYPE_CHECKING:
    from ..gate.decision import Judgement
    from ..host import views
    from ..host.comparisons import ReleaseFigures
    from ..host.history import HistoryRecord
    from ..host.releaseroot import HostSnapshot
    from ..inventory import HostConfig
    from ..pipeline.result import RestartTimes

console = common.out

EXIT_UNIT_NOT_ACTIVE = 3  # as `systemctl status` and `opsctl service HOST status`
EXIT_PARITY_FAIL = 31  # GateFailed's code: parity said no
EXIT_UNREADABLE = 10  # SshError's code: a host of a group could not be read


def status_command(
    host: common.TargetArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the state as JSON")] = False,
    inventory_path: common.InventoryOption = None,
) -> None:
    """Unit state, current release, last verdict, last parity figures, lock (of a host, or each host of a group).
    Exit 0 all well, 31 a FAIL line in the running invocation, 3 the unit not active, 10 a host not read."""
    from ..errors import OpsError

    inv = common.inventory(inventory_path)
    host = common.pick_target(inv, host, "status")
    if host in inv.hosts:
        doc = _status_one(inv.host(host), as_json)
        if as_json:
            common.emit_json(doc)
        if code := exit_code([doc]):
            raise typer.Exit(code=code)
        return
    docs: list[dict[str, Any]] = []
    for h in inv.resolve(host):
        try:
            docs.append(_status_one(h, as_json))
        except OpsError as e:  # one unreachable host must not hide the others
            docs.append({"host": h.name, "error": e.message})
            if not as_json:
                common.report_error(e)
        if not as_json:
            console.print()
    if as_json:
        common.emit_json(docs)
    if code := exit_code(docs):
        raise typer.Exit(code=code)


def exit_code(docs: list[dict[str, Any]]) -> int:
    """The exit code of the status of these hosts' JSON documents: a host not read (10) before a FAIL line (31)
    before a unit not active (3); 0 when none. Pure."""
    if any("error" in d for d in docs):
        return EXIT_UNREADABLE
    if any(d.get("parity_fail_lines") for d in docs):
        return EXIT_PARITY_FAIL
    if any((d.get("unit") or {}).get("active") != "active" for d in docs):
        return EXIT_UNIT_NOT_ACTIVE
    return 0


@dataclass(frozen=True)
class Story:
    """Where status's verdict and restart lines come from: the newest record with a verdict (``last``) and its gate's
    restart times (``times``, None when that gate did not probe or there is no verdict), and, only when it is a
    different, older record, the newest restart whose gate probed (``earlier_times``), said to be the earlier one."""

    last: HistoryRecord | None
    times: RestartTimes | None
    earlier_times: RestartTimes | None


def story(history: list[HistoryRecord]) -> Story:
    """The verdict and the restart times status prints, from one record where it can (pure)."""
    from ..pipeline.result import last_restart_times

    last_index = next((i for i in range(len(history) - 1, -1, -1) if history[i].verdict is not None), None)
    if last_index is None:
        return Story(None, None, last_restart_times(history))
    own = last_restart_times(history[last_index : last_index + 1])
    earlier = None if own is not None else last_restart_times(history[:last_index])
    return Story(history[last_index], own, earlier)


def bad_releases(snap: HostSnapshot) -> tuple[list[str], int]:
    """The releases marked bad that are still on the host, and how many marked ones cleanup has removed (pure)."""
    present = sorted(b for b in snap.bad if b in snap.releases)
    return present, len(snap.bad) - len(present)


@dataclass(frozen=True)
class _Parity:
    """The running invocation's parity lines as the gate judges them."""

    latest: list[Judgement]  # the newest counted line of each rank and layer
    counted: int
    ignored: int  # not evidence: no or wrong token, or the marker inside another message
    failed: list[Judgement]  # every counted FAIL line, oldest first

    @classmethod
    def judged(cls, h: HostConfig, view: views.StatusView) -> _Parity:
        from ..gate.decision import LineVerdict
        from .parityview import LineJudge, counted, latest_per_rank_and_layer

        line_judge = LineJudge(h, view.token)
        judged = [j for j in map(line_judge.message, view.parity_messages) if j is not None]
        evidence = counted(judged)
        failed = [j for j in evidence if j.verdict is LineVerdict.FAIL]
        return cls(latest_per_rank_and_layer(evidence), len(evidence), len(judged) - len(evidence), failed)

    def to_json(self) -> list[dict[str, Any]]:
        from .parityview import malformed_reason

        return [
            {
                "layer": p.layer,
                "rank": p.rank,
                "rel": p.rel,
                "max_abs_diff": p.max_abs_diff,
                "verdict": j.verdict,
                **({"malformed": why} if (why := malformed_reason(j)) else {}),
            }
            for j in self.latest
            if (p := j.line) is not None
        ]


def _status_one(h: HostConfig, as_json: bool) -> dict[str, Any]:
    """Read one host's state; print it for people unless ``as_json``; return the JSON document."""
    from ..host import views
    from ..host.comparisons import release_figures
    from ..lock import hostlock

    view = views.read_status(h)
    snap, hist = view.snap, view.history
    parity = _Parity.judged(h, view)
    told = story(hist)
    bad, bad_removed = bad_releases(snap)
    restart = told.times or told.earlier_times
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
        "bad": bad,
        "bad_removed": bad_removed,
        "last_verdict": told.last.as_json() if told.last else None,
        "last_restart": restart,
        # False: the restart times are of an older record than the last verdict (whose gate did not probe).
        "last_restart_is_last_verdict": told.times is not None,
        "lock": hostlock.describe_owner(snap.lock_owner) if snap.lock_present else None,
        "free_mb": snap.free_mb,
        "parity": parity.to_json(),
        "parity_fail_lines": len(parity.failed),
    }
    # The running release's figures from the comparison recorded when it was deployed (issue 37).
    running = release_figures(hist).get(snap.current or "")
    doc["comparison"] = running.to_json() if running is not None else None
    if not as_json:
        _print_state(h, snap, told, (bad, bad_removed), doc["lock"])
        _print_comparison(running)
        _print_parity(parity)
    return doc


def _print_comparison(running: ReleaseFigures | None) -> None:
    """The running release's decode speed, accepted drafts and its comparison line, from its deploy's record."""
    if running is None:
        return
    ms, accept = running.decode_ms_per_token, running.accept_length
    figures = [f"decode {ms:.1f} ms/token" if ms is not None else "decode -"]
    if accept is not None:
        figures.append(f"accepted drafts {accept:.1f}")
    console.print(
        f"running release: {', '.join(figures)} ({running.event} at {running.at}); {running.line or ''}",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )


def _shown(text: object) -> str:
    """Host text inside markup: escaped (opsctl.terminal) and its brackets too."""
    return escape_brackets(escaped(str(text)))


def _print_state(h: HostConfig, snap: HostSnapshot, told: Story, bad: tuple[list[str], int], lock: str | None) -> None:
    from ..pipeline.result import describe_restart_times
    from .parityview import verdict_style

    active = snap.unit.active_state == "active"
    unit_style = "green" if active else "red"
    # What the host told (the unit's states, the release ids it names) is shown escaped, never as markup.
    state = _shown(f"{snap.unit.active_state}/{snap.unit.sub_state}")
    console.print(
        f"[bold]{h.name}[/] ({h.target}) unit {h.unit}: [{unit_style}]{state}[/] restarts={snap.unit.n_restarts}",
        soft_wrap=True,
    )
    present, removed = bad
    bad_text = _shown(", ".join(present) or "none")
    if removed:
        bad_text += f" (+{removed} removed by cleanup)"
    console.print(
        f"current release: [bold]{_shown(snap.current or 'none')}[/]  last good: {_shown(snap.last_good or 'none')}"
        f"  bad: {bad_text}",
        soft_wrap=True,
    )
    if not snap.is_managed:
        console.print("[yellow]not managed by opsctl (adopt or deploy first)[/]")
    last = told.last
    if last is not None and last.verdict is not None:
        head = (
            f"last verdict: [{verdict_style(last.verdict)}]{_shown(last.verdict)}[/] "
            f"({_shown(f'{last.event} {last.release} at {last.at}')})"
        )
        if told.times is not None:
            head += f"; {describe_restart_times(told.times, with_record=False)}"
        console.print(head, highlight=False, soft_wrap=True)
    if told.earlier_times is not None:
        label = "last probed restart (an earlier record)" if last is not None else "last probed restart"
        console.print(f"{label}: {describe_restart_times(told.earlier_times)}", highlight=False, soft_wrap=True)
    console.print(f"lock: {_shown(lock or 'free')}   free disk: {snap.free_mb} MB", highlight=False, soft_wrap=True)
    if not active:
        console.print(f"the unit is not active: exit {EXIT_UNIT_NOT_ACTIVE}", style="red", highlight=False)


def _print_parity(parity: _Parity) -> None:
    from .parityview import describe_line, parity_table

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
            soft_wrap=True,
        )
    if parity.failed:
        newest = parity.failed[-1]
        console.print(
            f"{len(parity.failed)} parity line(s) of the running invocation FAIL (newest: {describe_line(newest)}): "
            f"exit {EXIT_PARITY_FAIL}",
            style="bold red",
            highlight=False,
            markup=False,
            soft_wrap=True,
        )


app = typer.Typer()
app.command("status")(common.bounded(status_command))
