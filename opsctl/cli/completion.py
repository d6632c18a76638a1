"""Shell completion of host and group names (``opsctl --install-completion`` installs it for the shell): read from
the inventory on this machine, never from a host. The inventory is the one the command line names
(``opsctl -i FILE ...`` or the command's own ``--inventory``), else ``$OPSCTL_INVENTORY`` or ./inventory.yaml; one
that cannot be read completes nothing (a completion never prints an error into the shell)."""

from __future__ import annotations

import contextlib
from pathlib import Path

import typer

_INVENTORY_PARAMS = ("inventory", "inventory_path")


def _inventory_given(ctx: typer.Context | None) -> Path | None:
    """The innermost --inventory on the line being completed (the command's own, else the global one)."""
    while ctx is not None:
        for name in _INVENTORY_PARAMS:
            value = ctx.params.get(name)
            if value:
                return Path(value)
        ctx = ctx.parent
    return None


def target_names(path: Path | None) -> list[str]:
    """The inventory's hosts then groups (its ``all`` target included), or nothing when it cannot be read."""
    from ..errors import OpsError
    from ..inventory import default_path, load

    with contextlib.suppress(OpsError, OSError, ValueError):
        inv = load(default_path(path))
        return [*inv.hosts, *(g for g in inv.groups if g not in inv.hosts)]
    return []


def complete_target(ctx: typer.Context, incomplete: str) -> list[str]:
    """Host and group names that start with what was typed."""
    return [name for name in target_names(_inventory_given(ctx)) if name.startswith(incomplete)]
