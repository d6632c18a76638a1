"""`opsctl hosts` (the inventory) and `opsctl ping` (reach each host, read its facts)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import typer
from rich.markup import escape

from . import common

if TYPE_CHECKING:
    from ..fleet.ping import PingReport

app = typer.Typer()


@app.command()
@common.bounded
def hosts(inventory: common.InventoryOption = None, json_out: common.JsonOption = False) -> None:
    """List the inventory's hosts and groups."""
    from rich.table import Table

    inv = common.inventory(inventory)
    member_of = {name: [g for g, members in inv.groups.items() if name in members] for name in inv.hosts}
    if json_out:
        common.emit_json(
            {
                "inventory": str(inv.path),
                "hosts": [{**h.model_dump(mode="json"), "groups": member_of[n]} for n, h in inv.hosts.items()],
                "groups": {g: list(m) for g, m in inv.groups.items()},
            }
        )
        return
    table = Table(title=str(inv.path), title_justify="left")
    for col in ("host", "ssh", "unit", "release root", "gpu arch", "service", "groups"):
        table.add_column(col)
    for name, h in inv.hosts.items():
        ssh = f"{h.user}@{h.target}" + (f":{h.port}" if h.port != 22 or not h.ssh_alias else "")
        table.add_row(
            name,
            escape(ssh),
            h.unit,
            h.root,
            h.gpu_arch or "-",
            h.service.mode,
            ", ".join(member_of[name]) or "-",
        )
    common.out.print(table)


# ---------------------------------------------------------------------------------------------- ping


def _ping_row(f: PingReport) -> list[str]:
    if not f.ok:
        return [
            f.host,
            f.target,
            common.ok_mark(f.reachable),
            common.ok_mark(False),
            "",
            "",
            "",
            "",
            f"[red]{escape(f.error or '')}[/]",
        ]
    unit = f.unit.get("ActiveState", "?")
    if f.unit.get("LoadState") == "not-found":
        unit = "not installed"
    gpus = ", ".join(f"{g.name} ({g.compute_cap})" for g in f.gpus) or "none"
    disk = f"{f.disk_free_mb} MB free" if f.disk_free_mb is not None else "?"
    if f.disk_ok is False:
        disk = f"[red]{disk} (< {f.min_free_disk_mb})[/]"
    state_style = "green" if f.system_state == "running" else "yellow"
    return [
        f.host,
        f.target,
        common.ok_mark(True),
        common.ok_mark(True),
        f"[{state_style}]{f.system_state}[/] (systemd {f.systemd_version})",
        escape(unit),
        escape(gpus),
        disk,
        f"{f.latency_ms:.0f} ms",
    ]


@app.command()
@common.bounded
def ping(
    target: common.TargetArg = None,
    inventory: common.InventoryOption = None,
    json_out: common.JsonOption = False,
    accept_new_host_key: common.AcceptNewHostKeyOption = False,
) -> None:
    """Reachability, ssh auth, systemd and unit state, GPUs (nvidia-smi), free disk. Hosts of a group in parallel.
    TARGET may also be 'all'. Exit 0 when every host answers, else the first failure's code (11-16)."""
    from rich.table import Table

    from ..fleet.ping import ping_many

    inv = common.inventory(inventory, accept_new_host_key=accept_new_host_key)
    facts = ping_many(inv.resolve(common.pick_target(inv, target, "ping")))
    if json_out:
        common.emit_json([{**common.to_jsonable(f), "ok": f.ok, "disk_ok": f.disk_ok} for f in facts])
    else:
        table = Table(title_justify="left")
        for col in ("host", "address", "reach", "auth", "systemd", "unit", "gpu", "disk", "ssh"):
            table.add_column(col)
        for f in facts:
            table.add_row(*_ping_row(f))
        common.out.print(table)
    failed = [f for f in facts if not f.ok]
    for f in failed:
        common.err.print(f"[bold red]error:[/] [red]{escape(f.error or '')}[/]", soft_wrap=True)
    if failed:
        raise typer.Exit(failed[0].exit_code or 1)
