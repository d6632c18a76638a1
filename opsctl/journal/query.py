"""journalctl queries, each beside the function that reads its output: the gate's mark (:func:`mark_command`,
:func:`parse_mark`) and poll (:func:`poll_command`, :func:`parse_poll`: the unit's state and the new entries,
resumable by cursor), the logs command (JSON entries, :func:`parse_entries`), the latest parity lines.

Every read passes ``--all`` (``-a``): without it journalctl prints a field of 4096 bytes or more as ``null`` in JSON
and a message with a control character as ``[N blob data]`` in text, so a long or garbled parity line would be
dropped unseen. A message that still comes back so is handed on as ``wire.LEFT_OUT`` (:func:`message_text`), which
the gate fails: never skipped."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from typing import Any

from kdtree_backend.wire import MARKER

from ..hostdata.facts import UnitObservation, parse_systemctl_show, unit_show_command
from ..unit.systemctl import service
from .entry import Entry, left_out_message

SEPARATOR = "--- opsctl journal ---"
# _LINE_BREAK: set by journald on a message it cut (at LineMax, 48K by default; at EOF, a PID change or a NUL):
# such a piece of a parity line is judged as one (gate.decision.judge's ``split``).
ENTRY_FIELDS = "MESSAGE,_SYSTEMD_INVOCATION_ID,__REALTIME_TIMESTAMP,_LINE_BREAK"
# A JSON entry whose MESSAGE is a byte array (not printable UTF-8) or null: text grep cannot search for the marker.
KEEP_UNDECODED = r'"MESSAGE" ?: ?(\[|null)'
POLL_PROPERTIES = ("ActiveState", "SubState", "NRestarts", "InvocationID", "Result")


def mark_command(unit: str) -> str:
    """The unit's InvocationID (first line), then the journal's last cursor as one JSON line."""
    return (
        f"systemctl show -p InvocationID --value {shlex.quote(service(unit))}; "
        f"journalctl -n 1 -o json --all --output-fields=__CURSOR --no-pager -q 2>/dev/null | tail -n 1"
    )


def poll_command(unit: str, cursor: str | None) -> str:
    """The unit's state, :data:`SEPARATOR`, then its journal entries after ``cursor`` as JSON lines."""
    after = f" --after-cursor={shlex.quote(cursor)}" if cursor else ""
    return (
        f"{unit_show_command(unit, POLL_PROPERTIES)}; echo {shlex.quote(SEPARATOR)}; "
        f"journalctl _SYSTEMD_UNIT={shlex.quote(service(unit))} -o json --all --output-fields={ENTRY_FIELDS} "
        f"--no-pager -q{after}"
    )


def logs_command(unit: str, *, since: str | None, lines: int, follow: bool, kdtree_only: bool) -> str:
    """The unit's journal as JSON lines: since a time, or the last ``lines``; ``kdtree_only`` keeps the
    ``[kdtree]`` lines, and every entry whose MESSAGE is a byte array or null (it may hold the marker; the reader
    decodes and judges it), grep exiting 1 when there are none."""
    argv = ["journalctl", "-u", service(unit), "-o", "json", "--all", "--output-fields=MESSAGE,__REALTIME_TIMESTAMP"]
    argv += ["--no-pager", "-q", *(["--since", since] if since else ["-n", str(lines)])]
    if follow:
        argv.append("-f")
    command = shlex.join(argv)
    keep = "|".join([re.escape(MARKER), KEEP_UNDECODED])
    return command + " | grep --line-buffered -E " + shlex.quote(keep) if kdtree_only else command


def latest_parity_lines_command(invocation_id: str, count: int = 64) -> str:
    """The last ``count`` ``[kdtree] L`` lines of one invocation, as plain messages."""
    return (
        f"journalctl _SYSTEMD_INVOCATION_ID={shlex.quote(invocation_id)} -o cat --all --no-pager -q "
        f"| grep -F {shlex.quote(MARKER + ' L')} | tail -n {int(count)}"
    )


@dataclass(frozen=True)
class Mark:
    """The journal position and invocation just before a restart."""

    old_invocation: str
    cursor: str | None
    n_restarts: int = 0
    token: str | None = None  # the parity token handed to the new invocation (None: lines are not token-checked)


def parse_mark(stdout: str) -> Mark:
    lines = stdout.split("\n")
    inv = lines[0].strip() if lines else ""
    cursor = None
    for line in lines[1:]:
        try:
            cursor = json.loads(line).get("__CURSOR") or cursor
        except ValueError:
            continue
    return Mark(old_invocation=inv, cursor=cursor)


def message_text(value: Any) -> str:
    """A JSON entry's MESSAGE as text: a string; a byte array (a message that is not printable UTF-8) decoded; a
    ``null`` (journalctl left it out: 4096 bytes or more without ``--all``) or anything else as ``wire.LEFT_OUT``,
    which the gate fails. An entry with no MESSAGE field at all is the caller's "" (``doc.get("MESSAGE", "")``)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, int) and 0 <= v <= 255 for v in value):
        return bytes(value).decode("utf-8", "replace")
    shown = "null" if value is None else f"a JSON {type(value).__name__}"
    return left_out_message(f"MESSAGE {shown} in journalctl's JSON")


def line_break(doc: dict[str, Any]) -> str:
    """A JSON entry's ``_LINE_BREAK`` as text ("" when journald did not cut the message). Any value counts, even
    one that is not a string: the piece is judged as a cut one."""
    value = doc.get("_LINE_BREAK")
    if value is None:
        return ""
    return value if isinstance(value, str) and value else "?"


def parse_entries(text: str) -> list[Entry]:
    out = []
    # One entry per \n-terminated line: journalctl prints U+2028, U+2029 raw inside a JSON string, and
    # str.splitlines() would cut such an entry in two and drop it (a failing parity line lost, not judged).
    for line in text.split("\n"):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            doc = json.loads(line)
        except ValueError:
            continue  # a line cut by a dropped connection; the cursor has not moved past it
        cursor = doc.get("__CURSOR")
        if not cursor:
            continue
        out.append(
            Entry(
                number=0,
                cursor=cursor,
                message=message_text(doc.get("MESSAGE", "")),
                invocation=str(doc.get("_SYSTEMD_INVOCATION_ID", "")),
                realtime_us=int(doc.get("__REALTIME_TIMESTAMP") or 0),
                line_break=line_break(doc),
            )
        )
    return out


def parse_unit_show(text: str) -> UnitObservation:
    kv = parse_systemctl_show(text)
    return UnitObservation(
        active_state=kv.get("ActiveState", "unknown"),
        sub_state=kv.get("SubState", "unknown"),
        n_restarts=int(kv.get("NRestarts") or 0),
        invocation_id=kv.get("InvocationID", ""),
        result=kv.get("Result", ""),
    )


def parse_poll(stdout: str) -> tuple[UnitObservation, list[Entry]]:
    """:func:`poll_command`'s output -> the unit's state and the journal entries after the cursor."""
    head, _, body = stdout.partition(SEPARATOR)
    return parse_unit_show(head), parse_entries(body)
