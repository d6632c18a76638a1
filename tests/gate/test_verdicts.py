"""The one verdict rule (opsctl.gate.verdicts.line_verdict) and its reasons agree: a line is IGNORED exactly when
ignored_reason says why, a FAIL of a sound line exactly when line_problems names a problem here, and the live gate's
feed gives the rule's verdict."""

from __future__ import annotations

import pytest

from opsctl.gate.decision import GateState
from opsctl.gate.lines import ParityLine, parse_line
from opsctl.gate.verdicts import LineVerdict, classify, ignored_reason, is_sound, line_problems, line_verdict
from opsctl.inventory import GateSettings

TOKEN = "0123456789abcdef0123456789abcdef"
S = GateSettings()


def body(rel: str = "2.0e-03", tp: int = 0, tail: str = f" token={TOKEN}") -> str:
    return f"[kdtree] L0 max_abs_diff=1.0e-03 mean=1.0e-04 rel={rel} tp={tp}{tail}"


LINES = [
    body(),
    body(rel="2.0e-02"),
    body(rel="9.0e-01"),
    body(tp=7),
    body(tp=8),
    body(rel="9.0e-01", tp=8),
    body(tail=""),
    body(tail=" token=fedcba9876543210fedcba9876543210"),
    body(tail=f" token={TOKEN[:12]}"),
    body(tail=f" token=fedcba9876543210fedcba9876543210 note={TOKEN}"),
    body(tail=f" token={TOKEN} rel=0"),
    "[kdtree] L0 garbled",
    "kdtree-launch: [kdtree] left out: MESSAGE null in journalctl's JSON",
]


@pytest.mark.parametrize("own", [TOKEN, None])
@pytest.mark.parametrize("text", LINES)
def test_the_rule_and_its_reasons_agree(text: str, own: str | None) -> None:
    line = parse_line(text)
    if not isinstance(line, ParityLine):
        return
    state = GateState(settings=S, started_at=0.0, deadline_s=60.0, expected_ranks=8, token=own)
    verdict = line_verdict(state, line.token, line.raw, line.rank, line.rel, sound=is_sound(line), hidden=line.hidden)
    assert (verdict is LineVerdict.IGNORED) == (ignored_reason(state, line) is not None)
    if verdict is not LineVerdict.IGNORED and is_sound(line):
        problems = line_problems(state, line)
        assert verdict is LineVerdict.FAIL if problems else verdict is classify(line, S)
    assert state.feed(line, 0.0) is verdict


def test_classify_is_the_rule_without_a_token_or_a_tp_size() -> None:
    line = parse_line(body(tp=9, tail=" token=fedcba9876543210fedcba9876543210"))
    assert isinstance(line, ParityLine)
    assert classify(line, S) is LineVerdict.PASS
