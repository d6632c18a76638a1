"""What the offline parity check (``opsctl parity check``, :mod:`opsctl.gate.parity_check`) found: each invocation's
gate run with what is listed of it (:class:`Invocation`: the counted lines up to :data:`MAX_LISTED`, the first
ignored ones and the first failures after the decision; the rest only counted), and the result with its JSON
(:class:`ParityCheck`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from .decision import GateState
from .lines import ParityLine
from .verdicts import Judgement, LineVerdict, Verdict, json_float, line_reason

MAX_LISTED = 1000  # counted lines listed per invocation (the rest only counted)
MAX_LISTED_IGNORED = 5  # ignored lines listed per invocation
MAX_LISTED_LATE = 5  # failing lines after the decision listed per invocation
# The members :meth:`Invocation.count_quietly` asks about, read once (in Python 3.11 ``Verdict.PENDING`` is a
# descriptor call, 150 ns, and it runs for most lines of a long journal).
_IGNORED, _FAIL, _PENDING = LineVerdict.IGNORED, LineVerdict.FAIL, Verdict.PENDING


@dataclass(frozen=True)
class CheckedLine:
    number: int  # 1-based line number in the input
    judgement: Judgement

    def to_json(self) -> dict[str, object]:
        j = self.judgement
        return {
            "line": self.number,
            "verdict": str(j.verdict),
            "reason": j.reason,
            "layer": j.line.layer if j.line else None,
            "tp": j.line.rank if j.line else None,
            "rel": json_float(j.line.rel) if j.line else None,
            "after_decision": j.after_decision,
            "text": j.raw.strip(),
        }


@dataclass
class Invocation:
    """One gate run over one invocation's lines: its state and what is listed of it."""

    index: int  # 1-based
    state: GateState
    first_line: int = 0
    last_line: int = 0
    parity_lines: int = 0  # parity lines seen (before and after the decision, ignored ones included)
    lines: list[CheckedLine] = field(default_factory=list)  # listed: counted, first ignored, first late failures
    token_fixed: bool = False  # a parity line has set the token (a message journalctl left out does not)
    ignored: int = 0  # every IGNORED judgement (wrong/missing token, marker inside another message)
    counted_unlisted: int = 0
    late: dict[LineVerdict, int] = field(default_factory=lambda: dict.fromkeys(LineVerdict, 0))
    _ignored_listed: int = 0
    _late_listed: int = 0
    _counted_listed: int = 0
    _ignored_quietly: int = 0  # ignored lines count_quietly took: the gate's state hears of them in conclude()

    @property
    def token(self) -> str | None:
        return self.state.token

    @property
    def verdict(self) -> Verdict:
        return self.state.verdict

    def add(self, number: int, j: Judgement) -> None:
        """Count one judged message (a parity line, or the marker inside another message)."""
        self._count(number, j.verdict, j.line, j.after_decision, j)

    def add_line(self, number: int, line: ParityLine, verdict: LineVerdict, after_decision: bool) -> None:
        """Count one parity line fed to this invocation's gate; its reason in words is made only if it is listed."""
        self._count(number, verdict, line, after_decision, None)

    def _count(
        self, number: int, verdict: LineVerdict, line: ParityLine | None, late: bool, j: Judgement | None
    ) -> None:
        self.last_line = number
        if line is not None:
            self.parity_lines += 1
        if verdict is LineVerdict.IGNORED:
            self.ignored += 1
            if self._ignored_listed >= MAX_LISTED_IGNORED:
                return
            self._ignored_listed += 1
        elif late:
            self.late[verdict] += 1
            if verdict is not LineVerdict.FAIL or self._late_listed >= MAX_LISTED_LATE:
                return
            self._late_listed += 1
        elif self._counted_listed < MAX_LISTED:
            self._counted_listed += 1
        else:
            self.counted_unlisted += 1
            return
        if j is None:
            assert line is not None
            j = Judgement(verdict, line_reason(self.state, line, verdict), line.raw, line, after_decision=late)
        self.lines.append(CheckedLine(number, j))

    def count_quietly(self, number: int, verdict: LineVerdict) -> bool:
        """Count a well-formed parity line by its verdict alone, when it changes nothing but the counts and will not
        be listed: one after the gate decided, or one the gate ignores once the ignored lines listed are full.
        False: it must take the full path (it is listed, or it counts towards the decision)."""
        if verdict is _IGNORED:
            if self._ignored_listed < MAX_LISTED_IGNORED:
                return False  # listed: the full path gives its reason
            self._ignored_quietly += 1
            self.ignored += 1
        elif verdict is _FAIL or self.state.verdict is _PENDING:
            return False  # a FAIL is listed, with its reason; before the decision a line counts
        else:
            self.late[verdict] += 1
        self.last_line = number
        self.parity_lines += 1
        return True

    def conclude(self) -> None:
        """The end of the input, which stands for the deadline: the gate's state counts the lines it ignored that
        :meth:`count_quietly` took (one call, not one a line), then decides."""
        self.state.count_ignored(self._ignored_quietly)
        self._ignored_quietly = 0
        self.state.conclude(0.0)

    def absorb(self, other: Invocation) -> None:
        """``other`` is this one's continuation (the same token after a restart boundary: an automatic restart
        of the same deploy, which its gate judged as one run). It holds no parity line that set a token yet; the
        lines it counted (messages journalctl left out) are judged again here."""
        for c in other.lines:
            j = c.judgement
            if j.line is not None and j.verdict is not LineVerdict.IGNORED and not j.after_decision:
                decided = self.state.decided
                verdict = self.state.feed(j.line, 0.0)
                j = Judgement(verdict, line_reason(self.state, j.line, verdict), j.raw, j.line, after_decision=decided)
            self.add(c.number, j)
        self.ignored += other.ignored - other._ignored_listed
        self.last_line = max(self.last_line, other.last_line)

    def totals(self) -> dict[str, object]:
        return {
            "ignored": self.ignored,
            "listed": len(self.lines),
            "counted_not_listed": self.counted_unlisted,
            "after_decision": {str(k): v for k, v in self.late.items() if k is not LineVerdict.IGNORED},
        }

    def brief(self) -> dict[str, object]:
        return {
            "index": self.index,
            "token": self.token,
            "first_line": self.first_line,
            "last_line": self.last_line,
            "verdict": str(self.state.verdict),
            "reason": self.state.reason,
            "parity_lines": self.parity_lines,
            "counted": self.state.lines,
            "ignored": self.ignored,
        }


@dataclass
class ParityCheck:
    """The judged invocation (the last one, or the whole text with a given token) and every invocation's
    figures."""

    judged: Invocation
    invocations: list[Invocation]  # every invocation, in input order (the judged one last)
    token_given: bool
    input_lines: int = 0
    input_format: str = "text"
    unreadable: int = 0
    left_out: int = 0  # messages journalctl did not print (see JournalReader.left_out), each a FAIL

    @property
    def state(self) -> GateState:
        return self.judged.state

    @property
    def verdict(self) -> Verdict:
        return self.judged.state.verdict

    @property
    def lines(self) -> list[CheckedLine]:
        return self.judged.lines

    def to_json(self, *, all_invocations: bool = False) -> dict[str, object]:
        st = self.state
        return {
            "verdict": str(st.verdict),
            "reason": st.reason,
            "settings": {
                "pass_rel": st.settings.pass_rel,
                "fail_rel": st.settings.fail_rel,
                "consecutive_passes": st.settings.consecutive_passes,
                "tp": st.expected_ranks,
                "token_checked": st.token is not None,
                "token_given": self.token_given,
            },
            "input": {
                "lines": self.input_lines,
                "format": self.input_format,
                "unreadable_json": self.unreadable,
                "messages_left_out": self.left_out,
            },
            "invocations_seen": len(self.invocations),
            "judged": self.judged.brief(),
            **({"invocations": [inv.brief() for inv in self.invocations]} if all_invocations else {}),
            "summary": {**st.summary(), **self.judged.totals()},
            "lines": [c.to_json() for c in self.judged.lines],
        }
