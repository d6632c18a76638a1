"""The release root's history (``<root>/state/history.jsonl``): one JSON line per deploy, restart, rollback, adopt,
lock break and their verdicts, appended in one write and read back, typed, for ``releases``, ``status`` and the
rollback target.

Its vocabulary lives here, below the pipeline that writes it and the commands that read it: ``HistoryEvent`` (what
happened), ``DeployVerdict`` (how a command ended) and ``HistoryRecord`` (one line). A record is written as the
JSON object of its set fields, keys sorted, and read back into the same dataclass; a line that is not such a
record (torn by a power cut, not an object, an event or verdict this opsctl does not know) is skipped."""

from __future__ import annotations

import functools
import json
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, fields
from enum import StrEnum
from typing import Any, get_args, get_origin, get_type_hints

from ..errors import EXIT_UNPROVEN, DeployFailed, GateFailed
from ..gate.decision import Verdict
from ..hostdata.layout import Layout
from ..ssh.remote import Remote
from .releaseroot import read_quietly_command, utc_now


class HistoryEvent(StrEnum):
    """What a history record tells: a command (the ``action`` of its result) or a lock break."""

    DEPLOY_START = "deploy-start"
    DEPLOY = "deploy"
    RESTART = "restart"
    ROLLBACK = "rollback"
    ADOPT = "adopt"
    LOCK_BREAK = "lock-break"
    CLEANUP = "cleanup"  # a deploy's cleanup removed releases (``removed``), after a pass or a failure


class DeployVerdict(StrEnum):
    """How a deploy, restart, rollback or adopt ended.

    Success (exit 0): PASS (gated), UP-TO-DATE (nothing to do), STAGED (--no-restart), PLANNED (--dry-run),
    ADOPTED (recorded as release zero), DONE (an ungated rollback).
    The release failed its parity (exit 31): FAIL, NODATA (no verdict by the deadline), INCONCLUSIVE.
    Not proven either way (exit 32): UNPROVEN (no verify traffic by the deadline, the probe disabled): rolled
    back, but the release is not marked bad and may be deployed again.
    Anything else (exit 30): ERROR (could not do or could not look), REFUSED (--dry-run of a refused deploy),
    INTERRUPTED (a signal; the host was restored first)."""

    PASS = "PASS"
    UP_TO_DATE = "UP-TO-DATE"
    STAGED = "STAGED"
    PLANNED = "PLANNED"
    ADOPTED = "ADOPTED"
    DONE = "DONE"
    FAIL = "FAIL"
    NODATA = "NODATA"
    INCONCLUSIVE = "INCONCLUSIVE"
    ERROR = "ERROR"
    REFUSED = "REFUSED"
    INTERRUPTED = "INTERRUPTED"
    UNPROVEN = "UNPROVEN"

    @classmethod
    def from_gate(cls, verdict: Verdict) -> DeployVerdict:
        """The command's verdict for a decided gate's (the gate never ends PENDING: that is a bug)."""
        try:
            return _FROM_GATE[verdict]
        except KeyError:
            raise ValueError(f"the gate has not decided ({verdict}): no verdict for the command") from None

    @property
    def ok(self) -> bool:
        return self in _SUCCESS

    @property
    def marks_bad(self) -> bool:
        """Whether a rejection with this verdict marks the release bad: a verdict on the release, not the lack
        of one (UNPROVEN) or an interruption."""
        return self not in _SUCCESS and self not in (DeployVerdict.UNPROVEN, DeployVerdict.INTERRUPTED)

    @property
    def exit_code(self) -> int:
        """The CLI's exit code for this verdict (the codes are errors.py's)."""
        if self.ok:
            return 0
        if self is DeployVerdict.UNPROVEN:
            return EXIT_UNPROVEN
        return GateFailed.exit_code if self in _PARITY_REJECTED else DeployFailed.exit_code


_FROM_GATE = {
    Verdict.PASS: DeployVerdict.PASS,
    Verdict.FAIL: DeployVerdict.FAIL,
    Verdict.INCONCLUSIVE: DeployVerdict.INCONCLUSIVE,
    Verdict.NODATA: DeployVerdict.NODATA,
    Verdict.ERROR: DeployVerdict.ERROR,
    Verdict.UNPROVEN: DeployVerdict.UNPROVEN,
}
_SUCCESS = frozenset(
    {
        DeployVerdict.PASS,
        DeployVerdict.UP_TO_DATE,
        DeployVerdict.STAGED,
        DeployVerdict.PLANNED,
        DeployVerdict.ADOPTED,
        DeployVerdict.DONE,
    }
)
_PARITY_REJECTED = frozenset({DeployVerdict.FAIL, DeployVerdict.NODATA, DeployVerdict.INCONCLUSIVE})


@dataclass(frozen=True)
class HistoryRecord:
    """One line of ``state/history.jsonl`` (docs/release-layout.md). Fields left None are not written."""

    event: HistoryEvent
    release: str | None = None  # None only for a lock break
    verdict: DeployVerdict | None = None
    reason: str | None = None
    previous: str | None = None  # what was current before
    current: str | None = None  # where `current` points once the event is over
    rolled_back_from: str | None = None  # a rollback: the release it left (written as "from")
    gate: dict[str, Any] | None = None  # the gate's summary (GateState.summary)
    stage: str | None = None  # where a deploy stopped, when not at the gate
    by: str | None = None
    commit: str | None = None
    dirty: bool | None = None
    automatic: bool | None = None  # a rollback opsctl did by itself after a failed gate
    forced: bool | None = None
    unit: str | None = None  # adopt: the hand-made unit's path
    files: int | None = None  # adopt: how many files were recorded
    owner: dict[str, Any] | None = None  # lock-break: the owner record of the lock that was broken
    removed: list[str] | None = None  # cleanup: the releases it removed
    comparison: dict[str, Any] | None = None  # deploy, restart: the comparison (opsctl/pipeline/comparison.py)
    # A gated deploy, restart or rollback: the unit's InvocationID whose lines the gate judged. UP-TO-DATE needs the
    # running invocation to be this one (a unit systemd restarted by itself since was never gated, issue 47).
    invocation: str | None = None
    at: str | None = None  # when it was written (UTC, by append_history); None before

    def as_json(self) -> dict[str, Any]:
        """The line's JSON object: the fields that are set, keys sorted as the file holds them."""
        doc = {_KEY.get(f.name, f.name): getattr(self, f.name) for f in fields(self)}
        return {k: doc[k] for k in sorted(doc) if doc[k] is not None}

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> HistoryRecord | None:
        """A line's object read back; None when it is no record this opsctl can read (an event or verdict it does
        not know). A value of the wrong type reads as unset; keys it does not know are left out."""
        try:
            event = HistoryEvent(doc.get("event"))
            verdict = None if doc.get("verdict") is None else DeployVerdict(doc["verdict"])
        except ValueError:
            return None
        values = {name: _typed(doc.get(_KEY.get(name, name)), kind) for name, kind in _json_types().items()}
        return cls(**{**values, "event": event, "verdict": verdict})


_KEY = {"rolled_back_from": "from"}  # field name -> key in the file, where they differ


@functools.cache
def _json_types() -> dict[str, type]:
    """Each field's JSON type, from its annotation (``str | None`` -> str, ``dict[str, Any] | None`` -> dict)."""
    out = {}
    for name, hint in get_type_hints(HistoryRecord).items():
        kind = next((a for a in get_args(hint) if a is not type(None)), hint)
        out[name] = get_origin(kind) or kind
    return out


def _typed(value: Any, kind: type) -> Any:
    """``value`` when the JSON held the field's type, else None (bool is no int here: `files: true` is no count)."""
    if kind is int and isinstance(value, bool):
        return None
    return value if isinstance(value, kind) else None


def append_history_command(layout: Layout) -> str:
    """Append the line given on stdin: on stdin, not in the command, because a record can be larger than one
    argument may be (a deploy's comparison carries both samples' output ids)."""
    return f"mkdir -p {shlex.quote(layout.state)} && cat >> {shlex.quote(layout.history)}"


def read_history_command(layout: Layout) -> str:
    return read_quietly_command(layout.history)


def append_history(r: Remote, layout: Layout, record: HistoryRecord) -> None:
    """One JSON line per event, appended by one write of ``cat`` (a line shorter than its buffer is never seen
    half-written; a torn last line after a power cut is skipped by the reader)."""
    line = json.dumps({**record.as_json(), "at": utc_now()}, sort_keys=True, default=str)
    r.run(append_history_command(layout), stdin=line + "\n", timeout=60)


def parse_history(text: str) -> list[HistoryRecord]:
    out = []
    for line in text.split("\n"):  # a line ends at \n only, as every reader of host output reads it
        try:
            doc = json.loads(line)
        except ValueError:
            continue  # a torn last line after a power cut is skipped, not fatal
        rec = HistoryRecord.from_json(doc) if isinstance(doc, dict) else None
        if rec is not None:
            out.append(rec)
    return out


def read_history(r: Remote, layout: Layout) -> list[HistoryRecord]:
    res = r.run(read_history_command(layout), timeout=60)
    return parse_history(res.stdout)


def release_verdicts(history: list[HistoryRecord]) -> dict[str, HistoryRecord]:
    """Latest record with a verdict per release (for `releases` and `status`)."""
    return {rec.release: rec for rec in history if rec.release is not None and rec.verdict is not None}
