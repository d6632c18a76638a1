"""opsctl: the command line. Thin over the library; every expected failure is one red line and an exit code."""

from __future__ import annotations

import logging
import sys
from typing import Annotated

import typer

from .. import __version__
from ..errors import EXIT_INTERRUPTED, EXIT_NOT_CONFIRMED, OpsError
from . import (
    adopt,
    bundle,
    capture,
    common,
    deploy,
    health,
    hosts,
    lock,
    logs,
    parity,
    releases,
    restart,
    service,
    status,
    testbed,
)

app = typer.Typer(
    name="opsctl",
    help="Ship the kdtree kernel + SGLang backend to GPU hosts: deploy, gate, rollback. Also the local testbed.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
# One module a group of commands, each with its own Typer app; unnamed ones add their commands at the top level.
app.add_typer(hosts.app)
app.add_typer(deploy.app)
app.add_typer(restart.app)  # restart, rollback
app.add_typer(adopt.app)
app.add_typer(service.app)
app.add_typer(releases.app)
app.add_typer(status.app)
app.add_typer(logs.app)
app.add_typer(lock.app)
app.add_typer(health.app)
app.add_typer(health.schedule_app, name="schedule")
app.add_typer(parity.app, name="parity")
app.add_typer(capture.app)
app.add_typer(bundle.app)
app.add_typer(testbed.app, name="testbed")


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


def main(argv: list[str] | None = None) -> int:
    """Entry point (console script ``opsctl`` and ``python -m opsctl``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
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
