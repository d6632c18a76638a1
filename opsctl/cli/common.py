"""What every opsctl command shares: consoles, the --inventory / --accept-new-host-key options, the inventory
loader, the default target, --json output, and the error boundary (an OpsError becomes one red line on stderr and
its exit code; with --json also ``{"error": ..., "exit_code": ...}`` on stdout; a traceback only with --debug).

A command module (opsctl/cli/<name>.py, added in main.py with ``app.add_typer(<name>.app)``) looks like:

    from . import common

    app = typer.Typer()

    @app.command()
    @common.bounded
    def logs(target: common.TargetArg = None, inventory: common.InventoryOption = None,
             json_out: common.JsonOption = False) -> None:
        inv = common.inventory(inventory)
        hosts = inv.resolve(common.pick_target(inv, target, "logs"))
        ...
        if json_out:
            common.emit_json([...])
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.segment import Segment

from ..errors import InventoryError, OpsError, UsageError
from ..terminal import escaped
from .completion import complete_target

if TYPE_CHECKING:
    from ..inventory import HostConfig, Inventory

# The inventory's environment variable (opsctl.inventory.loader.ENV_VAR; tests/cli/test_startup.py pins that they
# agree): named here so that --help does not import the inventory's models.
ENV_VAR = "OPSCTL_INVENTORY"


class EscapingConsole(Console):
    """A console that never writes a control character it was handed as text: whatever a view forgot to pass
    through :func:`opsctl.terminal.escaped` (text from a host, a journal or a sample) is escaped here, as the
    terminal is about to get it. Rich's own sequences (colours from the styles, the live display's cursor moves,
    which are control segments) are untouched; newlines and tabs in the text are kept (they are the layout)."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            seg if seg.control else Segment(escaped(seg.text, keep="\n\t"), seg.style) for seg in buffer
        )


# Piped output (logs, CI) is not cut to 80 columns; a terminal keeps its own width.
_WIDTH = None if sys.stdout.isatty() or os.environ.get("COLUMNS") else 160
out = EscapingConsole(highlight=False, width=_WIDTH)
err = EscapingConsole(stderr=True, highlight=False, width=_WIDTH)

InventoryOption = Annotated[
    Path | None,
    typer.Option(
        "--inventory", "-i", help=f"Inventory file (default: ${ENV_VAR} or ./inventory.yaml).", show_default=False
    ),
]
JsonOption = Annotated[bool, typer.Option("--json", help="Print machine-readable JSON on stdout.")]
TargetArg = Annotated[
    str | None,
    typer.Argument(
        help="Host or group (default: the inventory's `default`, else its only host).",
        show_default=False,
        autocompletion=complete_target,
    ),
]
HostArg = Annotated[
    str | None,
    typer.Argument(
        help="Host (default: the inventory's `default`, else its only host).",
        show_default=False,
        autocompletion=complete_target,
    ),
]
PlainOption = Annotated[
    bool,
    typer.Option(
        "--plain",
        help="One event a line, nothing redrawn or wrapped (the default off a terminal or with NO_COLOR set).",
    ),
]
VerboseOption = Annotated[
    bool, typer.Option("--verbose", "-v", help="Print every parity line and probe wave, not only the new facts.")
]
AcceptNewHostKeyOption = Annotated[
    bool,
    typer.Option(
        "--accept-new-host-key",
        help="Accept and record host keys not yet in known_hosts (a changed key is still refused).",
    ),
]


def finite(minimum: float | None = None) -> Callable[[str | float], float]:
    """A parser for a number option that must be finite (and >= ``minimum``):
    ``typer.Option(..., parser=common.finite(0))``. Click's FLOAT takes ``inf`` and ``nan``, which no threshold,
    size or timeout means and JSON cannot carry (a parser replaces Click's type, so it also checks the bound)."""

    def parse(value: str | float) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise typer.BadParameter(f"{value!r} is not a number") from None
        if not math.isfinite(number):
            raise typer.BadParameter(f"{value!r}: must be a finite number")
        if minimum is not None and number < minimum:
            raise typer.BadParameter(f"{value!r}: must be >= {minimum:g}")
        return number

    return parse


finite_float = finite()


@dataclass
class GlobalOptions:
    """Set by the top-level callback (``opsctl --inventory X --accept-new-host-key CMD``)."""

    inventory: Path | None = None
    accept_new_host_key: bool = False
    debug: bool = False


options = GlobalOptions()


def inventory(path: Path | str | None = None, *, accept_new_host_key: bool = False) -> Inventory:
    """Load the inventory: an explicit path, else the global --inventory, else $OPSCTL_INVENTORY, else
    ./inventory.yaml. With --accept-new-host-key (here or global), every host's policy becomes accept-new."""
    from ..inventory import default_path as inventory_path
    from ..inventory import load as load_inventory

    chosen = inventory_path(path or options.inventory)
    if not chosen.exists():
        down = _testbed_down_message(chosen)
        if down:
            raise InventoryError(down)
    inv = load_inventory(chosen)
    if accept_new_host_key or options.accept_new_host_key:
        hosts = {n: h.model_copy(update={"host_key_policy": "accept-new"}) for n, h in inv.hosts.items()}
        inv = dataclasses.replace(inv, hosts=hosts)
    return inv


def _testbed_down_message(path: Path) -> str | None:
    """A missing inventory.yaml of a testbed directory means that testbed is down: say so and how to boot it."""
    from ..testbed import DEFAULT_STATE_DIR, STATE_ENV, Testbed

    state_dir = path.absolute().parent
    ours = Testbed().state_dir
    looks_like_testbed = state_dir == ours or (state_dir / "id_ed25519").is_file() or (state_dir / ".lock").is_file()
    if path.name != "inventory.yaml" or not looks_like_testbed:
        return None
    default_dir = Path(DEFAULT_STATE_DIR).absolute()
    env = "" if state_dir == default_dir else f"{STATE_ENV}={state_dir} "
    return (
        f"{path}: the testbed at {state_dir} is down (its inventory exists only while it is up); "
        f"bring it up with: {env}.venv/bin/opsctl testbed up"
    )


def pick_target(inv: Inventory, given: str | None, command: str) -> str:
    """The host or group a command acts on: the one given, else the inventory's ``default``, else its only host.
    A chosen default is announced on stderr (stdout stays clean for --json)."""
    if given:
        return given
    if inv.default:
        why = f"the default of {inv.path}"
        chosen = inv.default
    elif len(inv.hosts) == 1:
        chosen = next(iter(inv.hosts))
        why = f"the only host in {inv.path}"
    else:
        groups = f"; groups: {', '.join(inv.groups)}" if inv.groups else ""
        raise UsageError(
            f"which host? {inv.path} has {len(inv.hosts)} hosts ({', '.join(inv.hosts) or 'none'}{groups}) and no "
            f"`default:`. Name one (opsctl {command} HOST) or add `default: HOST` to the inventory"
        )
    err.print(f"[dim]{command}: {escape(chosen)} ({escape(why)})[/]", soft_wrap=True)
    return chosen


def pick_host(inv: Inventory, given: str | None, command: str) -> HostConfig:
    """One host for a single-host command: the one given, else the default (a default group of one host counts)."""
    name = pick_target(inv, given, command)
    if name in inv.hosts:
        return inv.hosts[name]
    members = inv.resolve(name)
    if given is None and len(members) == 1:
        return members[0]
    raise UsageError(
        f"{name!r} is a group of {len(members)} hosts ({', '.join(h.name for h in members)}); "
        f"`opsctl {command}` takes one host: name it"
    )


def host_of(name: str | None, inventory_path: Path | None, command: str) -> HostConfig:
    """The host a single-host command acts on: the one named, else the inventory's default (announced)."""
    return pick_host(inventory(inventory_path), name, command)


def host_and_action(
    host: str | None, action: str | None, actions: tuple[str, ...], inventory_path: Path | None, command: str
) -> tuple[HostConfig, str | None]:
    """`opsctl CMD [HOST] ACTION`: with the host left out, the one word given is the action."""
    inv = inventory(inventory_path)
    if action is None and host in actions and host not in inv.hosts and host not in inv.groups:
        host, action = None, host
    return pick_host(inv, host, command), action


def to_jsonable(obj: Any) -> Any:
    """``obj`` as JSON can carry it: models and dataclasses as objects, paths as text, NaN and the infinities by
    name (``json_float``, the one place opsctl turns them)."""
    # No object is a pydantic model unless pydantic is loaded: a command that read no inventory does not load it.
    pydantic = sys.modules.get("pydantic")
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        from ..gate.decision import json_float  # imported only for a value that needs it (`hosts --json` starts fast)

        return json_float(obj)
    if pydantic is not None and isinstance(obj, pydantic.BaseModel):
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


def report_error(e: OpsError, *, as_json: bool = False, exit_code: int | None = None) -> int:
    """One red line on stderr; under --json also ``{"error", "exit_code", "kind"}`` on stdout; the traceback with
    --debug. ``exit_code`` overrides the error's own (a command with its own scale, like ``health``). Returns
    the exit code."""
    code = e.exit_code if exit_code is None else exit_code
    if options.debug:
        err.print(escape("".join(traceback.format_exception(e)).rstrip()), soft_wrap=True, highlight=False)
    # A message may quote a host, a journal or a file: escaped (its own line breaks kept).
    err.print(f"[bold red]error:[/] [red]{escape(escaped(e.message, keep=chr(10)))}[/]", soft_wrap=True)
    if as_json:
        emit_json({"error": e.message, "exit_code": code, "kind": type(e).__name__})
    return code


def report_unexpected(e: BaseException, *, as_json: bool = False, exit_code: int = 1) -> int:
    """A bug or an unforeseen library error: one line (and the traceback with --debug), exit code 1 (or the
    command's own failure code)."""
    if options.debug:
        err.print(escape("".join(traceback.format_exception(e)).rstrip()), soft_wrap=True, highlight=False)
    message = f"{type(e).__name__}: {e}"
    hint = "" if options.debug else " (rerun with --debug for the traceback)"
    err.print(f"[bold red]error:[/] [red]{escape(escaped(message, keep=chr(10)))}[/]{hint}", soft_wrap=True)
    if as_json:
        emit_json({"error": message, "exit_code": exit_code, "kind": type(e).__name__})
    return exit_code


def report_usage_error(e: typer.TyperException, *, as_json: bool = False, exit_code: int | None = None) -> int:
    """A usage error found by the option parser (bad option value, missing argument, unknown option): Click's
    own message and hint on stderr, and under --json also ``{"error", "exit_code", "kind"}`` on stdout, like
    every other error. Returns the exit code (2, or the command's own failure code)."""
    code = e.exit_code if exit_code is None else exit_code
    if as_json:
        err.print(f"[bold red]error:[/] [red]{escape(e.format_message())}[/]", soft_wrap=True)
        emit_json({"error": e.format_message(), "exit_code": code, "kind": type(e).__name__})
    else:
        from typer import rich_utils

        rich_utils.rich_format_error(e)
    return code


# Commands whose failures have an exit code of their own rather than the error's (`health`: 0/1/2 are its
# findings, so a failure of the check itself must be none of them; docs/exit-codes.md). Keyed by command name;
# main.py applies it to option-parser errors too.
FAILURE_EXIT: dict[str, int] = {}


def failure_exit(command: str | None) -> int | None:
    return FAILURE_EXIT.get(command or "")


@contextmanager
def error_boundary(as_json: bool = False) -> Iterator[None]:
    """OpsError -> one red line on stderr (plus the JSON error under --json) and ``raise typer.Exit(exit_code)``;
    no traceback unless --debug."""
    try:
        yield
    except OpsError as e:
        report_error(e, as_json=as_json)
        raise typer.Exit(e.exit_code) from None


def bounded(fn: Callable[..., None]) -> Callable[..., None]:
    """A command inside the error boundary (also when the app is driven by a test runner). A command's --json
    parameter is named ``as_json`` or ``json_out``; with it, errors are also a JSON object on stdout."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        with error_boundary(as_json=bool(kwargs.get("as_json") or kwargs.get("json_out"))):
            fn(*args, **kwargs)

    return wrapper


def bounded_failing_with(exit_code: int) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Like :func:`bounded`, for a command whose every failure (an OpsError, or a bug: an unexpected exception)
    exits ``exit_code`` instead of the error's own code, so a caller that reads the command's own scale (a
    systemd timer reading ``health``'s 0/1/2) can never take a crash for a finding."""

    def decorate(fn: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            as_json = bool(kwargs.get("as_json") or kwargs.get("json_out"))
            try:
                fn(*args, **kwargs)
            except (typer.Exit, typer.TyperException, typer.Abort):
                raise  # typer.Exit is a RuntimeError: the command's own exit code, not a failure
            except OpsError as e:
                raise typer.Exit(report_error(e, as_json=as_json, exit_code=exit_code)) from None
            except Exception as e:  # the boundary: a bug is one line and the failure code
                raise typer.Exit(report_unexpected(e, as_json=as_json, exit_code=exit_code)) from None

        return wrapper

    return decorate


def escape_brackets(text: str) -> str:
    """Text printed inside markup: every ``[`` escaped, so a message never opens a style."""
    return text.replace("[", "\\[")


def ok_mark(ok: bool | None) -> str:
    return "[green]✓[/]" if ok else ("[dim]-[/]" if ok is None else "[red]✗[/]")
