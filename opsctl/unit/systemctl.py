"""systemctl on the service unit (and on the health timer of the machine running opsctl). Units are named without
``.service`` by the inventory; the commands add it."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ..hostdata.facts import key_values

UNIT_DIR = "/etc/systemd/system"


def service(unit: str) -> str:
    return f"{unit}.service"


def unit_file_path(unit: str) -> str:
    return f"{UNIT_DIR}/{service(unit)}"


def systemctl_argv(*args: str, user: bool = False) -> list[str]:
    """``systemctl [--user] ARGS``."""
    return ["systemctl", *(["--user"] if user else []), *args]


def daemon_reload_argv() -> list[str]:
    return systemctl_argv("daemon-reload")


def verify_command(path: str) -> str:
    return shlex.join(["systemd-analyze", "verify", path])


def action_argv(action: str, unit: str) -> list[str]:
    """``systemctl start|stop|restart|is-active UNIT.service``."""
    return systemctl_argv(action, service(unit))


def status_argv(unit: str, lines: int = 15) -> list[str]:
    return systemctl_argv("status", "--no-pager", "-n", str(lines), service(unit))


def enable_once_command(unit: str) -> str:
    """Enable the unit, only when it is not enabled yet (``systemctl enable`` reloads the manager every time)."""
    u = shlex.quote(service(unit))
    return f"systemctl is-enabled --quiet {u} || systemctl enable --quiet {u}"


def stop_and_disable_command(unit: str) -> str:
    """Stop the unit and disable it, so that no boot starts it (what a deploy leaves when nothing good may run)."""
    u = shlex.quote(service(unit))
    return f"systemctl disable --quiet {u}; systemctl stop {u}"


def restart_command(unit: str) -> str:
    """Reset a failed unit (one that hit its start limit refuses a restart), restart it, and print ``rc=`` (the
    restart's exit status), ``restarts=`` (NRestarts) and one ``envfile=`` line per EnvironmentFiles entry
    (systemctl prints one line each, ``PATH (ignore_errors=yes)``), read by :func:`parse_restart_output`."""
    u = shlex.quote(service(unit))
    return (
        f'systemctl reset-failed {u} 2>/dev/null; systemctl restart {u}; echo "rc=$?"; '
        f'echo "restarts=$(systemctl show -p NRestarts --value {u})"; '
        f"systemctl show -p EnvironmentFiles --value {u} | sed 's/^/envfile=/'"
    )


@dataclass(frozen=True)
class RestartFacts:
    rc: int | None
    restarts: int | None
    envfiles: tuple[str, ...]  # the paths the new invocation reads, as systemd expanded them


def parse_restart_output(stdout: str) -> RestartFacts:
    """:func:`restart_command`'s output. Pure."""
    rc = restarts = None
    envfiles: list[str] = []
    for key, value in key_values(stdout):
        if key == "rc" and value.strip().isdigit():
            rc = int(value)
        elif key == "restarts" and value.strip().isdigit():
            restarts = int(value)
        elif key == "envfile" and value:
            envfiles.append(value.rsplit(" (ignore_errors=", 1)[0])
    return RestartFacts(rc, restarts, tuple(envfiles))


def read_unit_file_command(unit: str) -> str:
    """The installed unit file (exit status non-zero when there is none)."""
    return f"cat {shlex.quote(unit_file_path(unit))} 2>/dev/null"
