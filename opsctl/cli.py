"""opsctl: the command line. Thin over the library; every expected failure is one red line and an exit code."""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from . import __version__
from . import cli_common as common
from .errors import EXIT_INTERRUPTED, OpsError
from .ping import HostFacts, ping_many
from .testbed import DEFAULT_HOSTS, Testbed

app = typer.Typer(
    name="opsctl",
    help="Ship the kdtree kernel + SGLang backend to GPU hosts: deploy, gate, rollback. Also the local testbed.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
testbed_app = typer.Typer(
    help="Local test hosts: Debian booted with systemd-nspawn, sshd on 127.0.0.1.", no_args_is_help=True
)
app.add_typer(testbed_app, name="testbed")

# Command modules other parts of opsctl contribute; each has register(app). A module not written yet is skipped.
_COMMAND_MODULES = (
    "opsctl.cli_deploy",
    "opsctl.cli_health",
    "opsctl.cli_parity",
    "opsctl.cli_capture",
    "opsctl.cli_bundle",
)


def _log_line(line: str) -> None:
    """Progress of a testbed operation on stderr, one line each: paths are never wrapped."""
    common.err.print(f"[dim]{escape(line)}[/]", soft_wrap=True)


def _set_debug(value: bool) -> None:
    common.options.debug = value
    if value:  # library logs (paramiko's included) and tracebacks; without --debug they stay quiet
        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _version(value: bool) -> None:
    if value:
        common.out.print(f"opsctl {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    inventory: common.InventoryOption = None,
    accept_new_host_key: common.AcceptNewHostKeyOption = False,
    debug: Annotated[
        bool, typer.Option("--debug", help="Show library logs and tracebacks (errors are one line without it).")
    ] = False,
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version.")
    ] = False,
) -> None:
    common.options.inventory = inventory
    common.options.accept_new_host_key = accept_new_host_key
    _set_debug(debug)


# ---------------------------------------------------------------------------------------------- hosts


@app.command()
@common.bounded
def hosts(inventory: common.InventoryOption = None, json_out: common.JsonOption = False) -> None:
    """List the inventory's hosts and groups."""
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


def _ping_row(f: HostFacts) -> list[str]:
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


# ---------------------------------------------------------------------------------------------- testbed


@testbed_app.command("up")
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


@testbed_app.command("down")
@common.bounded
def testbed_down() -> None:
    """Stop every testbed host and remove them (the rootfs cache stays). Leaves no processes or mounts."""
    tb = Testbed()
    leftovers = tb.down(log=_log_line)
    for item in leftovers:
        common.err.print(f"[yellow]cleaned up a leftover: {escape(item)}[/]")
    common.out.print(f"testbed at {tb.state_dir} is down")


@testbed_app.command("status")
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


# ---------------------------------------------------------------------------------------------- other modules


def _register_command_modules(typer_app: typer.Typer, modules: tuple[str, ...] = _COMMAND_MODULES) -> list[str]:
    """Import each command module and let it add its commands. Only a module that does not exist is skipped."""
    loaded = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name == name:
                continue
            raise
        module.register(typer_app)
        loaded.append(name)
    return loaded


_register_command_modules(app)


def main(argv: list[str] | None = None) -> int:
    """Entry point (console script ``opsctl`` and ``python -m opsctl``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    try:
        app(args=args, prog_name="opsctl", standalone_mode=True)
    except OpsError as e:
        common.report_error(e, as_json=as_json)
        return e.exit_code
    except KeyboardInterrupt:
        common.err.print("[red]interrupted[/]")
        return EXIT_INTERRUPTED
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception as e:  # a bug or an unforeseen library error: one line, the traceback only with --debug
        return common.report_unexpected(e, as_json=as_json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
