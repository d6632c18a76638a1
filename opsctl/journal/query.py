"""journalctl queries: the gate's mark and poll (resumable by cursor), the logs command, the latest parity lines."""

from __future__ import annotations

import shlex

from ..host.facts import unit_show_command
from ..unit.systemctl import service

SEPARATOR = "--- opsctl journal ---"
ENTRY_FIELDS = "MESSAGE,_SYSTEMD_INVOCATION_ID,__REALTIME_TIMESTAMP"
POLL_PROPERTIES = ("ActiveState", "SubState", "NRestarts", "InvocationID", "Result")
MARKER = "[kdtree]"


def mark_command(unit: str) -> str:
    """The unit's InvocationID (first line), then the journal's last cursor as one JSON line."""
    return (
        f"systemctl show -p InvocationID --value {shlex.quote(service(unit))}; "
        f"journalctl -n 1 -o json --output-fields=__CURSOR --no-pager -q 2>/dev/null | tail -n 1"
    )


def poll_command(unit: str, cursor: str | None) -> str:
    """The unit's state, :data:`SEPARATOR`, then its journal entries after ``cursor`` as JSON lines."""
    after = f" --after-cursor={shlex.quote(cursor)}" if cursor else ""
    return (
        f"{unit_show_command(unit, POLL_PROPERTIES)}; echo {shlex.quote(SEPARATOR)}; "
        f"journalctl _SYSTEMD_UNIT={shlex.quote(service(unit))} -o json --output-fields={ENTRY_FIELDS} "
        f"--no-pager -q{after}"
    )


def logs_command(unit: str, *, since: str | None, lines: int, follow: bool, kdtree_only: bool) -> str:
    """The unit's journal as JSON lines: since a time, or the last ``lines``; ``kdtree_only`` keeps the
    ``[kdtree]`` lines (grep exits 1 when there are none)."""
    argv = ["journalctl", "-u", service(unit), "-o", "json", "--output-fields=MESSAGE,__REALTIME_TIMESTAMP"]
    argv += ["--no-pager", "-q", *(["--since", since] if since else ["-n", str(lines)])]
    if follow:
        argv.append("-f")
    command = shlex.join(argv)
    return command + " | grep --line-buffered -F " + shlex.quote(MARKER) if kdtree_only else command


def latest_parity_lines_command(invocation_id: str, count: int = 64) -> str:
    """The last ``count`` ``[kdtree] L`` lines of one invocation, as plain messages."""
    return (
        f"journalctl _SYSTEMD_INVOCATION_ID={shlex.quote(invocation_id)} -o cat --no-pager -q "
        f"| grep -F {shlex.quote(MARKER + ' L')} | tail -n {int(count)}"
    )
