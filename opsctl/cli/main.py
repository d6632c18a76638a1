"""opsctl: the command line. Thin over the library; every expected failure is one red line and an exit code.

It starts at once: a command module imports what it needs inside its commands, and the modules that still cost
an import (the inventory's models, the capture, health and testbed machinery) are registered by name here
(``LAZY``) and imported when one of their commands runs (or its help or completion is asked for). ``opsctl
--help`` and the commands that connect nowhere never load the SSH stack (tests/cli/test_startup.py)."""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Annotated, Any

import typer
from typer._click.core import Command, Context, Parameter  # Typer's own copy of Click's classes
from typer.core import TyperCommand, TyperGroup

from ..errors import EXIT_INTERRUPTED, EXIT_NOT_CONFIRMED, OpsError
from . import adopt, bundle, common, deploy, hosts, lock, releases, restart, service, status
from .helptext import flow_help

# Commands imported when used: name -> (module of opsctl.cli, its Typer, whether that Typer is the command's group of
# subcommands, the first paragraph of its help as `opsctl --help` shows it; tests/cli/test_startup.py pins it to the
# command's own help).
LAZY: dict[str, tuple[str, str, bool, str]] = {
    "logs": ("logs", "app", False, "The unit's journal; parity lines as a coloured table, shapes lines decoded."),
    "health": (
        "health",
        "app",
        False,
        "Check hosts: unit, HTTP, GPU, drift, parity, disk, lock; with --probe the verify path end to end. Exit 0 OK, "
        "1 WARN, 2 CRIT, 3 the check failed.",
    ),
    "schedule": ("health", "schedule_app", True, "Scheduled health checks (systemd timer on this machine)."),
    "parity": (
        "parity",
        "app",
        True,
        "Parity lines outside a deploy: check a journal offline, replay stored captures.",
    ),
    "capture": (
        "capture",
        "app",
        False,
        "Arm a capture of the next verify calls on HOST, wait until every TP rank has stored them, report.",
    ),
    "captures": (
        "capture",
        "app",
        False,
        "List the captures stored on HOST (age, release, size) and its capture request, armed or left behind; with "
        "--prune remove old ones (and an expired request), with --disarm the request.",
    ),
    "testbed": ("testbed", "app", True, "Local test hosts: Debian booted with systemd-nspawn, sshd on 127.0.0.1."),
    "compare": (
        "compare",
        "app",
        False,
        "Judge a candidate's comparison sample against a baseline's, as a deploy would; exit 0 pass, 31 fail, "
        "32 cannot decide.",
    ),
}


def load_command(name: str) -> Command:
    """The real command of a ``LAZY`` name, as Typer builds it under the root app."""
    module, attribute, is_group, _help = LAZY[name]
    holder = typer.Typer(add_completion=False)  # completion options belong to the root only
    holder.add_typer(
        getattr(importlib.import_module(f"{__package__}.{module}"), attribute), **({"name": name} if is_group else {})
    )
    group = typer.main.get_command(holder)
    assert isinstance(group, TyperGroup)
    return flow_help(group.commands[name])


class LazyCommand(TyperCommand):
    """A command whose module is imported when it is used; until then only its name and its help's first
    paragraph (what `opsctl --help` lists)."""

    def __init__(self, name: str, short_help: str) -> None:
        super().__init__(name, help=short_help)
        self._real: Command | None = None

    def real(self) -> Command:
        if self._real is None:
            self._real = load_command(str(self.name))
        return self._real

    def make_context(  # type: ignore[override]
        self, info_name: str | None, args: list[str], parent: Context | None = None, **extra: Any
    ) -> Context:
        return self.real().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: Context) -> Any:
        return self.real().invoke(ctx)

    def get_params(self, ctx: Context) -> list[Parameter]:
        return self.real().get_params(ctx)


class OpsctlGroup(TyperGroup):
    """The root group: the commands Typer registered, and the ``LAZY`` ones; every help text as prose."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        flow_help(self)
        for name, (_module, _attribute, _group, short_help) in LAZY.items():
            self.add_command(LazyCommand(name, short_help), name)

    def list_commands(self, ctx: Context) -> list[str]:
        return list(self.commands)  # in the order added (Typer's own first), as before


app = typer.Typer(
    name="opsctl",
    help="Ship the kdtree kernel + SGLang backend to GPU hosts: deploy, gate, rollback. Also the local testbed.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    cls=OpsctlGroup,
)
# One module a group of commands, each with its own Typer app; unnamed ones add their commands at the top level.
app.add_typer(hosts.app)
app.add_typer(deploy.app)
app.add_typer(restart.app)  # restart, rollback
app.add_typer(adopt.app)
app.add_typer(service.app)
app.add_typer(releases.app)
app.add_typer(status.app)
app.add_typer(lock.app)
app.add_typer(bundle.app)


def _set_debug(value: bool) -> None:
    common.options.debug = value
    if value:  # library logs (paramiko's included) and tracebacks; without --debug they stay quiet
        logging.basicConfig(level=logging.DEBUG, format="%(asctime)s %(name)s %(levelname)s %(message)s")


def _version(value: bool) -> None:
    if value:
        from .. import __version__

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


def main(argv: list[str] | None = None) -> int:
    """Entry point (console script ``opsctl`` and ``python -m opsctl``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    # `--json=1` is a usage error (a flag takes no value), reported as JSON like `--json` asked for.
    as_json = any(a == "--json" or a.startswith("--json=") for a in args)
    try:
        # Not standalone: Click's usage errors (bad option value, missing argument) come here instead of being
        # printed as a box and exiting, so under --json they are a JSON object like every other error.
        rc = app(args=args, prog_name="opsctl", standalone_mode=False)
    except typer.TyperException as e:
        return common.report_usage_error(e, as_json=as_json, exit_code=common.failure_exit(_command_of(e)))
    except typer.Abort:
        common.err.print("[red]aborted[/]")
        return EXIT_NOT_CONFIRMED
    except OpsError as e:
        return common.report_error(e, as_json=as_json)
    except KeyboardInterrupt:
        common.err.print("[red]interrupted[/]")
        return EXIT_INTERRUPTED
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except Exception as e:  # a bug or an unforeseen library error: one line, the traceback only with --debug
        return common.report_unexpected(e, as_json=as_json)
    return rc if isinstance(rc, int) else 0


def _command_of(e: typer.TyperException) -> str | None:
    """The name of the command a usage error belongs to (None for the top level)."""
    ctx = getattr(e, "ctx", None)
    return ctx.command.name if ctx is not None and ctx.command is not None else None


if __name__ == "__main__":
    sys.exit(main())
