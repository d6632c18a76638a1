"""The gate's verdicts and the one rule that gives a parity line its verdict (docs/gate.md).

:func:`line_verdict` is that rule, over a line's values: the live gate's ``GateState.feed``, the offline check's
lane for well-formed lines (``opsctl/gate/parity_check.py``, without a :class:`ParityLine`) and :func:`classify`
all ask it; :func:`line_problems` and :func:`line_reason` say why in words, for whoever lists the line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple, Protocol

from .lines import ParityLine
from .ownership import claims_token, cut_token

if TYPE_CHECKING:
    from ..inventory import GateSettings  # annotations only: the offline commands' --help loads no pydantic


class LineVerdict(StrEnum):
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    IGNORED = "IGNORED"


class Verdict(StrEnum):
    PENDING = "PENDING"
    PASS = "PASS"
    FAIL = "FAIL"
    INCONCLUSIVE = "INCONCLUSIVE"
    NODATA = "NODATA"
    ERROR = "ERROR"
    UNPROVEN = "UNPROVEN"

    @property
    def ok(self) -> bool:
        return self is Verdict.PASS


class Traffic(StrEnum):
    """What makes the unit print parity lines while the gate watches."""

    SELF = "self"  # the replay service prints on a timer: no line by the deadline means it is broken (NODATA)
    PROBE = "probe"  # the gate's own probe requests (gate.probe): readiness and the waves are evidence too
    NONE = "none"  # only whatever traffic the host gets: no line at all by the deadline is UNPROVEN


NO_TRAFFIC_REASON = "no verify traffic; enable gate.probe or deploy under load"


class Watch(Protocol):
    """What the rule reads of a gate (``decision.GateState``): its thresholds, the watched invocation's token and
    the unit's TP size."""

    @property
    def settings(self) -> GateSettings: ...

    @property
    def token(self) -> str | None: ...

    @property
    def expected_ranks(self) -> int | None: ...


def line_verdict(
    watch: Watch,
    token: str | None,
    raw: str,
    rank: int | None,
    rel: float,
    *,
    sound: bool = True,
    hidden: bool = False,
) -> LineVerdict:
    """The one verdict rule. A line with ``token=`` ``token`` and text ``raw`` is IGNORED when the gate watches an
    invocation's token and the line is not that invocation's (``ownership.claims_token``); a FAIL when it is
    malformed here (not ``sound``: problems of its own, values not finite or negative; its token= not the
    invocation's although the token is in it or cut short there; a rank outside the unit's TP size:
    :func:`line_problems` names which) or its rel reaches the fail threshold; else PASS or INCONCLUSIVE by the
    pass threshold. ``hidden``: a message journalctl left out or journald split, the invocation's whatever it
    shows. Counts nothing."""
    own = watch.token
    if own is not None and token != own and not hidden:
        return _FAIL if claims_token(own, token, raw) else _IGNORED
    expected = watch.expected_ranks
    if not sound or (expected is not None and rank is not None and rank >= expected):
        return _FAIL
    s = watch.settings
    if rel >= s.fail_rel:
        return _FAIL
    return _PASS if rel <= s.pass_rel else _INCONCLUSIVE


# The members, read once: in Python 3.11 ``LineVerdict.PASS`` is a descriptor call (150 ns), and the rule runs for
# every line of a long journal.
_PASS, _FAIL, _INCONCLUSIVE, _IGNORED = (
    LineVerdict.PASS,
    LineVerdict.FAIL,
    LineVerdict.INCONCLUSIVE,
    LineVerdict.IGNORED,
)


class _Thresholds(NamedTuple):
    """A watch of no invocation and no TP size: the rule's thresholds alone (:func:`classify`)."""

    settings: GateSettings
    token: str | None = None
    expected_ranks: int | None = None


def is_sound(line: ParityLine) -> bool:
    """No problem of its own, and its values finite and not negative."""
    return not line.problems and line.finite and line.rel >= 0


def classify(line: ParityLine, settings: GateSettings) -> LineVerdict:
    """One parity line -> PASS / FAIL / INCONCLUSIVE, whatever its token and rank. A malformed line or anything not
    finite fails."""
    return line_verdict(_Thresholds(settings), line.token, line.raw, line.rank, line.rel, sound=is_sound(line))


def ignored_reason(watch: Watch, line: ParityLine) -> str | None:
    """Why this line is not evidence at all (None when it is): a missing or foreign token."""
    own = watch.token
    if own is None or line.carries(own):
        return None
    if line.token is None:
        return "no token= (not printed by the watched invocation)"
    return "wrong token= (not printed by the watched invocation)"


def line_problems(watch: Watch, line: ParityLine) -> tuple[str, ...]:
    """What makes a line malformed here: its own problems, a rank outside the unit's TP size, and the
    invocation's token inside a line whose ``token=`` is not it."""
    out = line.problems
    expected = watch.expected_ranks
    if expected is not None and line.rank is not None and line.rank >= expected:
        out = (*out, f"tp={line.rank} outside the unit's {expected} TP ranks")
    own = watch.token
    if own is not None and line.token != own and not line.hidden:
        if own in line.raw:
            out = (*out, "the invocation's token is in the line but its token= is not the invocation's")
        elif (piece := cut_piece(own, line.token, line.raw)) is not None:
            out = (
                *out,
                f"its token= is cut short ({len(piece)} of the invocation's {len(own)} characters): a line "
                "journald split inside its token, or one truncated there",
            )
    return out


def line_reason(watch: Watch, line: ParityLine, verdict: LineVerdict) -> str:
    """Why one line got its verdict, in words a reader can check against the thresholds."""
    s = watch.settings
    if verdict is LineVerdict.IGNORED:
        return ignored_reason(watch, line) or "ignored"
    problems = line_problems(watch, line)
    if problems:
        return "malformed: " + "; ".join(problems)
    if verdict is LineVerdict.FAIL:
        return f"rel {line.rel:.4g} >= fail threshold {s.fail_rel:g}"
    if verdict is LineVerdict.INCONCLUSIVE:
        return f"{s.pass_rel:g} < rel {line.rel:.4g} < {s.fail_rel:g}: neither pass nor fail, breaks the streak"
    return f"rel {line.rel:.4g} <= {s.pass_rel:g}"


def cut_piece(own: str, token: str | None, raw: str) -> str | None:
    """The strict prefix of ``own`` a line's token was cut to (its ``token=`` value ``token``, or the text its
    message ``raw`` ends with after ``token=``), or None."""
    if token is not None and token != own and own.startswith(token):
        return token
    return cut_token(raw, own)


@dataclass(frozen=True)
class Judgement:
    """What the gate made of one journal message that is, or pretends to be, a parity line."""

    verdict: LineVerdict
    reason: str
    raw: str
    line: ParityLine | None = None  # None: the marker was inside another message
    after_decision: bool = False  # judged, but the gate had decided already (a deploy would have stopped reading)


def json_float(x: float) -> float | str:
    """A number for JSON: NaN and the infinities, which JSON cannot carry, as their names ("nan", "inf", "-inf").
    The one place every opsctl JSON document (gate summaries, parity check, the CLI's --json) turns them."""
    return x if math.isfinite(x) else str(x)
