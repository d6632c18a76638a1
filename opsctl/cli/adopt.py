"""``opsctl adopt``: record a hand-made install as release zero."""

from __future__ import annotations

from typing import Annotated

import typer

from . import common


def adopt_command(
    host: common.HostArg = None,
    as_json: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    inventory_path: common.InventoryOption = None,
) -> None:
    """Record an existing hand-made install (files + unit) as release zero, without restarting anything."""
    from .. import pipeline
    from . import progress

    h = common.host_of(host, inventory_path, "adopt")
    host = h.name
    with progress.reporter(host, as_json) as rep:
        res = pipeline.adopt(h, rep)
    progress.finish(res, as_json)


app = typer.Typer()
app.command("adopt")(common.bounded(adopt_command))
