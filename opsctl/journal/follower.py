"""Follow the journal of a unit's new invocation(s) over SSH, resumable by cursor.

Before a restart, ``mark`` records the unit's InvocationID and the journal's last cursor. The follower then asks
for the unit's entries after that cursor and keeps only those whose ``_SYSTEMD_INVOCATION_ID`` differs from the
old invocation: the new process and any automatic restart of it, never the old one's last words. Each poll is
one command returning the unit's state and the new entries; the cursor advances only over entries already
handed out, so after an SSH drop the next poll resumes exactly there and no line is counted twice.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..gate.decision import UnitObservation
from ..host.facts import parse_systemctl_show
from . import query as host_journal
from .query import SEPARATOR

__all__ = [
    "SEPARATOR",
    "Entry",
    "Follower",
    "Mark",
    "message_text",
    "parse_entries",
    "parse_mark",
    "parse_unit_show",
]


@dataclass(frozen=True)
class Mark:
    """The journal position and invocation just before a restart."""

    old_invocation: str
    cursor: str | None
    n_restarts: int = 0
    token: str | None = None  # the parity token handed to the new invocation (None: lines are not token-checked)


@dataclass(frozen=True)
class Entry:
    cursor: str
    message: str
    invocation: str
    realtime_us: int


def parse_mark(stdout: str) -> Mark:
    lines = stdout.splitlines()
    inv = lines[0].strip() if lines else ""
    cursor = None
    for line in lines[1:]:
        try:
            cursor = json.loads(line).get("__CURSOR") or cursor
        except ValueError:
            continue
    return Mark(old_invocation=inv, cursor=cursor)


def message_text(value: Any) -> str:
    """journald's MESSAGE is a string, or a byte array when it is not valid UTF-8."""
    if isinstance(value, list):
        return bytes(v & 0xFF for v in value if isinstance(v, int)).decode("utf-8", "replace")
    return value if isinstance(value, str) else ""


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
                cursor=cursor,
                message=message_text(doc.get("MESSAGE")),
                invocation=str(doc.get("_SYSTEMD_INVOCATION_ID", "")),
                realtime_us=int(doc.get("__REALTIME_TIMESTAMP") or 0),
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


@dataclass
class Follower:
    unit: str
    mark: Mark
    cursor: str | None = None
    seen: set[str] = field(default_factory=set)
    invocations: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.cursor is None:
            self.cursor = self.mark.cursor

    def poll_command(self) -> str:
        return host_journal.poll_command(self.unit, self.cursor)

    def ingest(self, stdout: str) -> tuple[UnitObservation, list[Entry]]:
        """One poll's output -> the unit's state and the new invocation's entries not handed out before."""
        head, _, body = stdout.partition(SEPARATOR)
        obs = parse_unit_show(head)
        if (
            obs.invocation_id
            and obs.invocation_id != self.mark.old_invocation
            and obs.invocation_id not in self.invocations
        ):
            self.invocations.append(obs.invocation_id)
        fresh = []
        for entry in parse_entries(body):
            self.cursor = entry.cursor  # journal order: everything up to here has been seen
            if entry.cursor in self.seen:
                continue
            self.seen.add(entry.cursor)
            if entry.invocation and entry.invocation == self.mark.old_invocation:
                continue
            if entry.invocation and entry.invocation not in self.invocations:
                self.invocations.append(entry.invocation)
            fresh.append(entry)
        return obs, fresh
