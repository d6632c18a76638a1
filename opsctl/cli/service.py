"""``opsctl service``: start, stop or show the unit, without a gate."""

from __future__ import annotations

from typing import Annotated

import typer

from ..errors import EXIT_UNIT_INACTIVE
from . import common

console = common.out


def service_command(
    host: common.HostArg = None,
    action: Annotated[str | None, typer.Argument(help="start | stop | status", show_default=False)] = None,
    inventory_path: common.InventoryOption = None,
) -> None:
    """Start, stop or show the service unit (no gate: use `restart` for a gated restart)."""
    from ..host import views

    h, action = common.host_and_action(host, action, views.SERVICE_ACTIONS, inventory_path, "service")
    host = h.name
    unit = h.unit + ".service"
    done = views.service(h, action)  # refuses an unknown action before connecting
    if action == "status":
        console.print(done.status_text, highlight=False, markup=False)
        raise typer.Exit(code=0 if done.status_rc == 0 else EXIT_UNIT_INACTIVE)
    state = done.state
    console.print(
        f"{host}: {unit} {action} -> {state}", style="green" if (state == "active") == (action == "start") else "red"
    )


app = typer.Typer()
app.command("service")(common.bounded(service_command))
