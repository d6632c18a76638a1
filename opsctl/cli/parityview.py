"""How the commands show a parity line and its verdict: the verdicts' colours, the numbers, the table that
``status`` and ``logs`` print, and the judge they ask.

``status`` and ``logs`` never judge a line themselves: ``LineJudge`` hands each journal message to the deploy
gate's own judge (``opsctl.gate.decision.judge``) with the host's gate settings, its TP size and the token the
running invocation was handed. So a line without that token, or the marker inside another message, reads IGNORED
there as it does at the gate, a rank outside the unit's TP size or a garbled line FAIL, the rest by the
thresholds."""

from __future__ import annotations

import math

from rich.table import Table
from rich.text import Text

from ..gate.decision import GateState, Judgement, LineVerdict, Verdict, judge, judge_record
from ..gate.lines import ParityLine
from ..inventory import HostConfig
from ..terminal import escaped

# A line's verdict (LineVerdict), the gate's (Verdict) and a command's (DeployVerdict) share their words (PASS,
# FAIL, ...): each is shown in the colour of its word, whichever of the three it is.
_STYLE: dict[str, str] = {
    LineVerdict.PASS: "bold green",
    LineVerdict.FAIL: "bold red",
    LineVerdict.INCONCLUSIVE: "yellow",
    LineVerdict.IGNORED: "dim",
    Verdict.NODATA: "red",
    Verdict.ERROR: "bold red",
    Verdict.UNPROVEN: "yellow",
}


def verdict_style(verdict: str) -> str:
    """The rich style of a verdict, a LineVerdict, Verdict or DeployVerdict (each a StrEnum: its word); none for
    the successes that are not a PASS (STAGED, ADOPTED, ...)."""
    return _STYLE.get(verdict, "")


def verdict_text(verdict: str) -> Text:
    return Text(verdict, style=verdict_style(verdict))


class LineJudge:
    """The gate's verdict on each parity line a command shows, one line at a time, as a deploy's gate would give
    it: ``token`` is the one the running invocation was handed (``state/parity.env``); None (no opsctl restart
    yet) judges the lines without one, as the gate does when the unit cannot carry it."""

    def __init__(self, host: HostConfig, token: str | None) -> None:
        # A gate that never stops at a PASS: each line gets its own verdict, whatever came before it.
        self._gate = GateState.every_line(host.gate, expected_ranks=host.service.tp, token=token)

    def message(self, text: str) -> Judgement | None:
        """One journal message; None when it is not about parity at all (no marker)."""
        return judge(self._gate, text, 0.0)

    def line(self, line: ParityLine) -> Judgement:
        """One parsed parity line."""
        return judge_record(self._gate, line, 0.0)


def counted(judgements: list[Judgement]) -> list[Judgement]:
    """The judgements the gate would count (IGNORED ones are not evidence)."""
    return [j for j in judgements if j.line is not None and j.verdict is not LineVerdict.IGNORED]


def latest_per_rank_and_layer(judgements: list[Judgement]) -> list[Judgement]:
    """The newest line of each (rank, layer), in rank then layer order: a whole step's figures, never the tail of a
    line list that starts in the middle of a step. Lines without a record (a marker inside another message) are
    left out."""
    newest: dict[tuple[int, int], Judgement] = {}
    for j in judgements:
        if j.line is not None:
            newest[(-1 if j.line.rank is None else j.line.rank, j.line.layer)] = j
    return [newest[key] for key in sorted(newest)]


def fmt(x: float) -> str:
    return f"{x:.4g}" if math.isfinite(x) else str(x)


def malformed_reason(j: Judgement) -> str | None:
    """Why a judged line is malformed (its own problems, or a rank outside the unit's TP size); None when it is
    well formed. A malformed line has no figures worth showing (its layer reads -1, its rel NaN)."""
    return j.reason.removeprefix("malformed: ") if j.reason.startswith("malformed: ") else None


def describe_line(j: Judgement) -> str:
    """One judged line in words: ``TP3 L12 rel=0.41 FAIL``, or a malformed line's reason."""
    p = j.line
    if p is None:
        return f"{escaped(j.raw.strip()[:120])} {j.verdict}"
    rank = f"TP{p.rank} " if p.rank is not None else ""
    why = malformed_reason(j)
    if why is not None:
        return f"{rank}malformed line ({escaped(why)}) {j.verdict}"
    return f"{rank}L{p.layer} rel={fmt(p.rel)} max_abs_diff={fmt(p.max_abs_diff)} {j.verdict}"


def parity_table(judgements: list[Judgement], title: str = "", times: list[str] | None = None) -> Table:
    """One row a judged line: its rank, layer and figures (``-`` for a marker inside another message) and the
    gate's verdict; a malformed line shows why instead of its figures."""
    table = Table(title=title or None)
    if times:
        table.add_column("time")
    for col in ("rank", "layer", "max_abs_diff", "mean", "rel", "verdict"):
        table.add_column(col, justify="right" if col not in ("verdict",) else "left")
    reasons = [malformed_reason(j) for j in judgements]
    if any(reasons):
        table.add_column("malformed")
    for i, j in enumerate(judgements):
        p, why = j.line, reasons[i]
        rank = f"TP{p.rank}" if p is not None and p.rank is not None else "-"
        if p is None or why is not None:
            figures = [rank, "-", "-", "-", "-"]
        else:
            figures = [rank, f"L{p.layer}", fmt(p.max_abs_diff), fmt(p.mean), fmt(p.rel)]
        extra = [Text(escaped(why or ""))] if any(reasons) else []
        table.add_row(*([times[i]] if times else []), *figures, verdict_text(j.verdict), *extra)
    return table
