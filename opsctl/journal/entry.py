"""One journal entry as opsctl reads it: live from a host (:mod:`opsctl.journal.query`, with its cursor) or from a
stored journal's text or JSON (:mod:`opsctl.journal.reader`, with its line number)."""

from __future__ import annotations

from typing import NamedTuple

from kdtree_backend.wire import LEFT_OUT


class Entry(NamedTuple):
    """A tuple: the stored journal's reader makes one for every marked line of a long journal."""

    number: int  # a stored journal's 1-based input line (0: read live)
    message: str  # a text line as printed (prefixes included when ``prefixed``), or a JSON MESSAGE
    invocation: str = ""  # _SYSTEMD_INVOCATION_ID, when the input has it
    boundary: bool = False  # a stored journal: a restart boundary, the start of a new invocation of the unit
    unreadable: bool = False  # a stored journal: a line of JSON input that is not an entry (judged as text)
    prefixed: bool = False  # a line of journalctl's short* output: its first journald prefix is the format's
    line_break: str = ""  # _LINE_BREAK: why journald cut this message ("" when it did not; judged as a piece)
    cursor: str = ""  # __CURSOR (read live)
    realtime_us: int = 0  # __REALTIME_TIMESTAMP (read live)


def left_out_message(detail: str) -> str:
    """The message a reader hands on for one journalctl did not print (``detail``: what it printed instead):
    ``wire.LEFT_OUT``, which the gate fails."""
    return f"{LEFT_OUT}: {detail}"
