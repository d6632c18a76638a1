"""`opsctl testbed up|down|status|variant`: the local test hosts and misbehaving releases (docs/testbed.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import UsageError
from ..release import BUNDLE_DIRS, default_tree
from ..testbed import DEFAULT_HOSTS, Testbed, variants
from . import common

app = typer.Typer(help="Local test hosts: Debian booted with systemd-nspawn, sshd on 127.0.0.1.", no_args_is_help=True)


def _log_line(line: str) -> None:
    """Progress of a testbed operation on stderr, one line each: paths are never wrapped."""
    common.err.print(f"[dim]{escape(line)}[/]", soft_wrap=True)


@app.command("up")
@common.bounded
def testbed_up(
    count: Annotated[int, typer.Argument(help="Number of fleet hosts tb1..tbN (plus 'local').")] = DEFAULT_HOSTS,
    json_out: common.JsonOption = False,
) -> None:
    """Build the rootfs once (cached), then boot 'local' and tb1..tbN; hosts already running are kept."""
    tb = Testbed()
    report = tb.up(count, log=_log_line)
    if json_out:
        common.emit_json(report)
        return
    _print_status(tb)
    build = f"rootfs built in {report.rootfs_build_s:.0f}s" if report.rootfs_build_s is not None else "rootfs cached"
    common.out.print(
        f"{build}; provisioned in {report.provision_s:.1f}s; booted in {report.boot_s:.1f}s; total {report.total_s:.1f}s"
    )
    common.out.print(f"inventory: {report.inventory}   (export OPSCTL_INVENTORY={report.inventory})", soft_wrap=True)


@app.command("down")
@common.bounded
def testbed_down() -> None:
    """Stop every testbed host and remove them (the rootfs cache stays). Leaves no processes or mounts."""
    tb = Testbed()
    leftovers = tb.down(log=_log_line)
    for item in leftovers:
        common.err.print(f"[yellow]cleaned up a leftover: {escape(item)}[/]")
    common.out.print(f"testbed at {tb.state_dir} is down")


@app.command("status")
@common.bounded
def testbed_status(json_out: common.JsonOption = False) -> None:
    """Each testbed host: running or stopped, sshd answering, boot time, free disk."""
    tb = Testbed()
    if json_out:
        common.emit_json({"state_dir": str(tb.state_dir), "hosts": tb.status()})
        return
    _print_status(tb)


def _print_status(tb: Testbed) -> None:
    table = Table(title=f"testbed {tb.state_dir}", title_justify="left")
    for col in ("host", "ssh", "state", "sshd", "boot", "disk free"):
        table.add_column(col)
    for h in tb.status():
        table.add_row(
            h.name,
            f"root@127.0.0.1:{h.port}",
            "[green]running[/]" if h.state == "running" else f"[yellow]{h.state}[/]",
            common.ok_mark(h.sshd),
            f"{h.boot_s:.1f}s" if h.boot_s is not None else "-",
            f"{h.disk_free_mb} MB" if h.disk_free_mb is not None else "-",
        )
    if not table.row_count:
        common.out.print(f"no testbed hosts at {tb.state_dir} (opsctl testbed up)")
        return
    common.out.print(table)


@app.command("variant")
@common.bounded
def testbed_variant(
    kind: Annotated[
        str,
        typer.Argument(
            help="seed-bug: drafts left out of the keys (docs/sglang-verify.md); slow: verify steps 1.5x as long; "
            "common-mode: a wrong scale the kernel and its reference share (parity passes, answers change)"
        ),
    ],
    dest: Annotated[Path, typer.Argument(help="directory to write the release tree into")],
    src: Annotated[Path | None, typer.Option("--src", help="working tree to copy (default: this checkout)")] = None,
) -> None:
    """Write a copy of a working tree with one deliberate bug, to deploy with --src and watch the gate catch it."""
    if kind not in variants.VARIANTS:
        raise UsageError(f"unknown variant {kind!r}: one of {', '.join(sorted(variants.VARIANTS))}")
    src = (src or default_tree()).resolve()
    missing = [d for d in BUNDLE_DIRS if not (src / d).is_dir()]
    if missing:
        raise UsageError(f"{src} is not a kdtree-engine tree (no {', '.join(missing)}/)")
    try:
        tree = variants.VARIANTS[kind](src, dest)
    except variants.VariantError as exc:
        raise UsageError(str(exc)) from None
    common.out.print(str(tree), soft_wrap=True)
