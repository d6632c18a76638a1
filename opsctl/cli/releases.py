"""``opsctl releases``: the releases on a host, their state and last verdict, and what cleanup removed and when."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

import typer

from . import common

if TYPE_CHECKING:
    from ..host.comparisons import ReleaseFigures
    from ..host.history import HistoryRecord
    from ..host.releaseroot import HostSnapshot

# How many removed releases the table shows below the ones on the host (--json gives every one).
SHOWN_REMOVED = 10


def releases_command(
    host: common.HostArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the releases as JSON")] = False,
    inventory_path: common.InventoryOption = None,
) -> None:
    """List the releases on HOST: id, created, commit, current/good/bad, last verdict, decode speed relative to
    the release it replaced; then the releases cleanup removed, and when. --json carries each release's comparison
    samples (for opsctl compare)."""
    from ..host import history as host_history
    from ..host import views
    from ..host.comparisons import release_figures

    h = common.host_of(host, inventory_path, "releases")
    view = views.read_releases(h)
    snap, hist, info = view.snap, view.history, view.meta
    verdicts = host_history.release_verdicts(hist)
    figures = release_figures(hist)  # each release's comparison with the one it replaced (issue 37)
    rows = [
        present_row(rid, flags_of(rid, snap), info.get(rid, {}), verdicts.get(rid), figures.get(rid))
        for rid in sorted(snap.releases, key=lambda x: snap.releases[x], reverse=True)
    ]
    rows += [
        removed_row(rid, rec, verdicts.get(rid), figures.get(rid))
        for rid, rec in removed_releases(hist, set(snap.releases))
    ]
    if as_json:
        common.emit_json(rows)
        return
    print_table(rows, figures, title=f"releases on {h.name} ({h.root})")


def flags_of(rid: str, snap: HostSnapshot) -> list[str]:
    """What the release is on the host: current, last-good, bad, adopted (release zero)."""
    return [
        flag
        for flag, on in (
            ("current", rid == snap.current),
            ("last-good", rid == snap.last_good),
            ("bad", rid in snap.bad),
            ("adopted", rid.startswith("r0-")),
        )
        if on
    ]


def present_row(
    rid: str, flags: list[str], meta: dict[str, Any], last: HistoryRecord | None, figures: ReleaseFigures | None
) -> dict[str, Any]:
    """A release on the host, as --json prints it."""
    return {
        "id": rid,
        "created": meta.get("created_at", "?"),
        "commit": meta.get("commit"),
        "dirty": meta.get("dirty"),
        "flags": flags,
        "verdict": last.verdict if last else None,
        "verdict_at": last.at if last else None,
        # Where the last verdict was reached when not at the gate ("pre-restart speed", ...), and why.
        "stage": last.stage if last else None,
        "reason": last.reason if last else None,
        "comparison": figures.to_json(samples=True) if figures is not None else None,
    }


def removed_row(
    rid: str, rec: HistoryRecord, last: HistoryRecord | None, figures: ReleaseFigures | None
) -> dict[str, Any]:
    """A release a cleanup removed, as --json prints it."""
    return {
        "id": rid,
        "created": None,
        "commit": None,
        "dirty": None,
        "flags": ["removed"],
        "verdict": last.verdict if last else None,
        "verdict_at": last.at if last else None,
        "removed_at": rec.at,
        "removed_by": f"cleanup after deploying {rec.release}" if rec.release else "cleanup",
        "comparison": figures.to_json(samples=True) if figures is not None else None,
    }


def print_table(rows: list[dict[str, Any]], figures: dict[str, ReleaseFigures], title: str) -> None:
    """The releases on the host, then the last SHOWN_REMOVED removed ones (dim)."""
    from rich.table import Table
    from rich.text import Text

    from ..terminal import escaped
    from .parityview import verdict_text

    table = Table(title=title)
    for col in ("id", "created", "commit", "state", "last verdict", "decode"):
        table.add_column(col)
    present = [row for row in rows if "removed" not in row["flags"]]
    for row in present:
        commit = (row["commit"] or "-")[:10] + ("+dirty" if row["dirty"] else "")
        # Ids, times and commits are read from the host: shown escaped, never as markup.
        table.add_row(
            Text(escaped(str(row["id"]))),
            Text(escaped(str(row["created"] or ""))),
            Text(escaped(commit)),
            Text(escaped(", ".join(row["flags"]))),
            verdict_text(row["verdict"]) if row["verdict"] else "-",
            decode_text(figures.get(row["id"])),
        )
    gone = [row for row in rows if "removed" in row["flags"]]
    for row in gone[:SHOWN_REMOVED]:
        table.add_row(
            Text(escaped(str(row["id"])), style="dim"),
            "-",
            "-",
            Text(escaped(f"removed {row['removed_at'] or '?'} ({row['removed_by']})"), style="dim"),
            verdict_text(row["verdict"]) if row["verdict"] else "-",
            "-",
        )
    common.out.print(table)
    if len(gone) > SHOWN_REMOVED:
        common.out.print(f"[dim]{len(gone) - SHOWN_REMOVED} older removed release(s): --json lists them[/]")


def decode_text(figures: ReleaseFigures | None) -> str:
    """``1.03x of r5d1e…`` (its decode speed relative to the release it replaced) and its own ms/token."""
    if figures is None:
        return "-"
    ms = figures.decode_ms_per_token
    own = f"{ms:.1f} ms/token" if ms is not None else "-"
    if figures.decode_ratio is None or not figures.baseline_release:
        return own
    return f"{figures.decode_ratio:.2f}x of {figures.baseline_release} ({own})"


def removed_releases(history: list[HistoryRecord], on_host: set[str]) -> list[tuple[str, HistoryRecord]]:
    """Each release a cleanup record says it removed and that is not on the host now, newest removal first, with
    that record (pure)."""
    from ..host.history import HistoryEvent

    seen: dict[str, HistoryRecord] = {}
    for rec in reversed(history):
        if rec.event is HistoryEvent.CLEANUP:
            for rid in rec.removed or []:
                if rid not in on_host and rid not in seen:
                    seen[rid] = rec
    return list(seen.items())


app = typer.Typer()
app.command("releases")(common.bounded(releases_command))
