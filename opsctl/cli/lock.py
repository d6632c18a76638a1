"""``opsctl lock``: who holds a host's deploy lock (and its lease), or break it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import EXIT_LOCK_HELD, UsageError
from . import common

if TYPE_CHECKING:
    from ..host import releaseroot

console = common.out


def lease_text(snap: releaseroot.HostSnapshot) -> str:
    """How long the holder's lease still runs (it renews it while alive), or why the lock may be taken over."""
    left = snap.lock_remaining_s
    rebooted = bool(snap.lock_boot_id) and snap.lock_boot_id != snap.boot_id
    if rebooted:
        return " (stale: taken before the host last booted; the next deploy takes it over)"
    if left is None:
        return ""
    if left <= 0:
        return f" (lease expired {-left:.0f}s ago: its holder stopped renewing it; the next deploy takes it over)"
    return f", lease {left:.0f}s left (renewed while its holder runs)"


def lock_command(
    host: common.HostArg = None,
    action: Annotated[str | None, typer.Argument(help="status (default) | release", show_default=False)] = None,
    force: Annotated[bool, typer.Option("--force", help="required by release: break someone else's lock")] = False,
    inventory_path: common.InventoryOption = None,
) -> None:
    """Show who holds the deploy lock of HOST, or break it (`release --force`, only when its owner is gone)."""
    from ..host import views
    from ..lock import hostlock

    h, action = common.host_and_action(host, action, ("status", "release"), inventory_path, "lock")
    host = h.name
    action = action or "status"
    if action not in ("status", "release"):
        raise UsageError(f"lock action must be status or release, not {action!r}")
    if action == "release" and not force:
        raise UsageError("breaking a lock needs --force (check `opsctl lock HOST status` first: is its owner gone?)")
    snap = views.read_lock(h, break_it=action == "release")
    owner = hostlock.describe_owner(snap.lock_owner) + lease_text(snap)
    if action == "release":
        msg = f"{host}: broke the lock held by {owner}" if snap.lock_present else f"{host}: lock was already free"
        console.print(msg, style="yellow" if snap.lock_present else "green", highlight=False)
    elif snap.lock_present:
        console.print(f"{host}: locked by {owner}", style="yellow", highlight=False)
        raise typer.Exit(code=EXIT_LOCK_HELD)
    else:
        console.print(f"{host}: lock free", style="green")


app = typer.Typer()
app.command("lock")(common.bounded(lock_command))
