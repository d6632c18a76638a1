"""``opsctl releases``: the releases on a host, their state and last verdict."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from ..host import history as host_history
from ..host import views
from . import common
from .parityview import verdict_text


def releases_command(
    host: common.HostArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the releases as JSON")] = False,
    inventory_path: common.InventoryOption = None,
) -> None:
    """List the releases on HOST: id, created, commit, current/good/bad, last verdict."""
    h = common.host_of(host, inventory_path, "releases")
    host = h.name
    view = views.read_releases(h)
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
        last = verdicts.get(rid)
        rows.append(
            {
                "id": rid,
                "created": info.get(rid, {}).get("created_at", "?"),
                "commit": info.get(rid, {}).get("commit"),
                "dirty": info.get(rid, {}).get("dirty"),
                "flags": flags,
                "verdict": last.verdict if last else None,
                "verdict_at": last.at if last else None,
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
        table.add_row(
            row["id"],
            row["created"],
            commit,
            ", ".join(row["flags"]),
            verdict_text(row["verdict"]) if row["verdict"] else "-",
        )
    common.out.print(table)


app = typer.Typer()
app.command("releases")(common.bounded(releases_command))
