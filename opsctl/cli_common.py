"""What every opsctl command shares: consoles, the --inventory / --accept-new-host-key options, the inventory
loader, --json output, and the error boundary (an OpsError becomes one red line on stderr and its exit code).

A command module (opsctl/cli_<name>.py) looks like:

    from opsctl import cli_common as common

    def register(app: typer.Typer) -> None:
        @app.command()
        def logs(target: str, inventory: common.InventoryOption = None, json_out: common.JsonOption = False) -> None:
            hosts = common.inventory(inventory).resolve(target)
            ...
            if json_out:
                common.emit_json([...])
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel
from rich.console import Console
from rich.markup import escape

from .errors import OpsError
from .inventory import ENV_VAR, Inventory
from .inventory import load as load_inventory

# Piped output (logs, CI) is not cut to 80 columns; a terminal keeps its own width.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
out = Console(highlight=False, width=_WIDTH)
err = Console(stderr=True, highlight=False, width=_WIDTH)

InventoryOption = Annotated[
    Path | None,
    typer.Option(
        "--inventory", "-i", help=f"Inventory file (default: ${ENV_VAR} or ./inventory.yaml).", show_default=False
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
AcceptNewHostKeyOption = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-key",
        help="Accept and record host keys not yet in known_hosts (a changed key is still refused).",
    ),
]


@dataclass
class GlobalOptions:
    """Set by the top-level callback (``opsctl --inventory X --accept-new-host-key CMD``)."""

    inventory: Path | None = None
    accept_new_host_key: bool = False


options = GlobalOptions()


def inventory(path: Path | str | None = None, *, accept_new_host_key: bool = False) -> Inventory:
    """Load the inventory: an explicit path, else the global --inventory, else $OPSCTL_INVENTORY, else
    ./inventory.yaml. With --accept-new-host-key (here or global), every host's policy becomes accept-new."""
    inv = load_inventory(path or options.inventory)
    if accept_new_host_key or options.accept_new_host_key:
        hosts = {n: h.model_copy(update={"host_key_policy": "accept-new"}) for n, h in inv.hosts.items()}
        inv = dataclasses.replace(inv, hosts=hosts)
    return inv


def to_jsonable(obj: Any) -> Any:
    if isinstance(obj, BaseModel):
        return obj.model_dump(mode="json")
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: to_jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, dict):
        return {str(k): to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple | set):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, Path):
        return str(obj)
    return obj


def emit_json(obj: Any) -> None:
    """JSON on stdout, nothing else there (progress and errors go to stderr)."""
    sys.stdout.write(json.dumps(to_jsonable(obj), indent=2, sort_keys=False) + "\n")
    sys.stdout.flush()


def report_error(e: OpsError) -> None:
    err.print(f"[bold red]error:[/] [red]{escape(e.message)}[/]", soft_wrap=True)


@contextmanager
def error_boundary() -> Iterator[None]:
    """OpsError -> one red line on stderr and ``raise typer.Exit(exit_code)``; no traceback."""
    try:
        yield
    except OpsError as e:
        report_error(e)
        raise typer.Exit(e.exit_code) from None


def ok_mark(ok: bool | None) -> str:
    return "[green]✓[/]" if ok else ("[dim]-[/]" if ok is None else "[red]✗[/]")
