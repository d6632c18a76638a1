"""Follow the journal of a unit's new invocation(s) over SSH, resumable by cursor.

Before a restart, ``mark`` records the unit's InvocationID and the journal's last cursor. The follower then asks
for the unit's entries after that cursor and keeps only those whose ``_SYSTEMD_INVOCATION_ID`` differs from the
old invocation: the new process and any automatic restart of it, never the old one's last words. Each poll is
one command returning the unit's state and the new entries; the cursor advances only over entries already
handed out, so after an SSH drop the next poll resumes exactly there and no line is counted twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..hostdata.facts import UnitObservation
from . import query
from .entry import Entry
from .query import Mark, parse_poll


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
        return query.poll_command(self.unit, self.cursor)

    def ingest(self, stdout: str) -> tuple[UnitObservation, list[Entry]]:
        """One poll's output -> the unit's state and the new invocation's entries not handed out before."""
        obs, entries = parse_poll(stdout)
        if (
            obs.invocation_id
            and obs.invocation_id != self.mark.old_invocation
            and obs.invocation_id not in self.invocations
        ):
            self.invocations.append(obs.invocation_id)
        fresh = []
        for entry in entries:
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
