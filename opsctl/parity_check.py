"""The offline parity check (``opsctl parity check FILE|-``): journal text in, each parity line's verdict and the
gate's aggregate verdict out, decided by the same parser and the same ``GateState`` as a deploy's gate.

The differences from a live gate are only the ones an offline journal forces: there is no unit to observe and
no clock, so the end of the text is the deadline (``GateState.conclude``): K passes on every rank -> PASS; a
failing or malformed line -> FAIL; a silent rank or no line -> NODATA; anything else -> INCONCLUSIVE.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .errors import GateFailed
from .gate import GateState, Judgement, Verdict, judge
from .inventory import GateSettings


@dataclass(frozen=True)
class CheckedLine:
    number: int  # 1-based line number in the input
    judgement: Judgement


@dataclass
class ParityCheck:
    state: GateState
    lines: list[CheckedLine] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        return self.state.verdict

    def to_json(self) -> dict[str, object]:
        return {
            "verdict": str(self.state.verdict),
            "reason": self.state.reason,
            "settings": {
                "pass_rel": self.state.settings.pass_rel,
                "fail_rel": self.state.settings.fail_rel,
                "consecutive_passes": self.state.settings.consecutive_passes,
                "tp": self.state.expected_ranks,
                "token_checked": self.state.token is not None,
            },
            "summary": self.state.summary(),
            "lines": [
                {
                    "line": c.number,
                    "verdict": str(c.judgement.verdict),
                    "reason": c.judgement.reason,
                    "layer": c.judgement.line.layer if c.judgement.line else None,
                    "tp": c.judgement.line.rank if c.judgement.line else None,
                    "rel": _json_float(c.judgement.line.rel) if c.judgement.line else None,
                    "after_decision": c.judgement.after_decision,
                    "text": c.judgement.raw.strip(),
                }
                for c in self.lines
            ],
        }

    def raise_unless_pass(self) -> None:
        if self.state.verdict is not Verdict.PASS:
            raise GateFailed(f"parity check {self.state.verdict}: {self.state.reason}")


def check_journal(
    text: Iterable[str], settings: GateSettings, *, tp: int | None = None, token: str | None = None
) -> ParityCheck:
    """Judge journal text (any journalctl output format, or bare messages) as the deploy's gate would."""
    state = GateState(settings=settings, started_at=0.0, deadline_s=settings.deadline_s, expected_ranks=tp, token=token)
    check = ParityCheck(state=state)
    for number, message in enumerate(text, 1):
        j = judge(state, message.rstrip("\n"), 0.0)
        if j is not None:
            check.lines.append(CheckedLine(number, j))
    state.conclude(0.0)
    return check


def _json_float(x: float) -> float | str:
    return x if x == x and abs(x) != float("inf") else str(x)
