import math

import pytest

from opsctl.gate.decision import GateState, LineVerdict, Verdict
from opsctl.gate.lines import ParityLine, parse_line
from opsctl.gate.verdicts import classify
from opsctl.hostdata.facts import UnitObservation
from opsctl.inventory import GateSettings

S = GateSettings(pass_rel=0.01, fail_rel=0.05, consecutive_passes=3, deadline_s=60, max_restarts=1, ssh_retries=2)


def line(rel: float, rank: int | None = 0, layer: int = 1, token: str | None = None) -> ParityLine:
    return ParityLine(layer=layer, max_abs_diff=rel, mean=rel / 10, rel=rel, rank=rank, token=token)


def gate(**kw: object) -> GateState:
    return GateState(settings=S, started_at=0.0, deadline_s=S.deadline_s, **kw)  # type: ignore[arg-type]


def test_classify() -> None:
    assert classify(line(0.001), S) is LineVerdict.PASS
    assert classify(line(0.01), S) is LineVerdict.PASS
    assert classify(line(0.02), S) is LineVerdict.INCONCLUSIVE
    assert classify(line(0.05), S) is LineVerdict.FAIL
    assert classify(line(math.nan), S) is LineVerdict.FAIL
    assert classify(line(math.inf), S) is LineVerdict.FAIL
    assert classify(ParityLine(1, math.nan, 0.0, 0.0), S) is LineVerdict.FAIL


def test_k_consecutive_passes() -> None:
    g = gate()
    for i, rel in enumerate([0.001, 0.001, 0.02, 0.001, 0.001]):
        g.feed(line(rel), float(i))
        assert g.verdict is Verdict.PENDING
    g.feed(line(0.001), 5.0)
    assert g.verdict is Verdict.PASS and g.decided_at == 5.0


def test_fail_at_once_and_sticky() -> None:
    g = gate()
    g.feed(line(0.001), 1)
    g.feed(line(1.08), 2)
    assert g.verdict is Verdict.FAIL and "rel=1.08" in g.reason
    for _ in range(5):
        g.feed(line(0.001), 3)
    assert g.verdict is Verdict.FAIL


def test_nan_never_passes() -> None:
    g = gate()
    g.feed(line(0.001), 1)
    g.feed(line(math.nan), 2)
    assert g.verdict is Verdict.FAIL and "not finite" in g.reason
    assert g.summary()["worst"]["rel"] == "nan"  # type: ignore[index]


def test_failure_on_any_rank_fails() -> None:
    g = gate(expected_ranks=2)
    g.feed(line(0.001, rank=0), 1)
    g.feed(line(0.001, rank=1), 1)
    g.feed(line(0.2, rank=1), 2)
    assert g.verdict is Verdict.FAIL and "TP1" in g.reason


def test_every_rank_needs_its_streak() -> None:
    g = gate(expected_ranks=2)
    for _ in range(5):
        g.feed(line(0.001, rank=0), 1)
    assert g.verdict is Verdict.PENDING  # rank 1 has not spoken yet
    for _ in range(3):
        g.feed(line(0.001, rank=1), 2)
    assert g.verdict is Verdict.PASS


def test_deadline_nodata_and_inconclusive() -> None:
    g = gate()
    g.tick(59.9)
    assert g.verdict is Verdict.PENDING
    g.tick(60.0)
    assert g.verdict is Verdict.NODATA
    g2 = gate()
    g2.feed(line(0.02), 1)
    g2.tick(61)
    assert g2.verdict is Verdict.INCONCLUSIVE


def test_crash_loop_and_failed_unit() -> None:
    g = gate(baseline_restarts=4)
    g.observe_unit(UnitObservation("activating", "auto-restart", 5, "a"), 1)
    assert g.verdict is Verdict.PENDING
    g.observe_unit(UnitObservation("activating", "auto-restart", 6, "b"), 2)
    assert g.verdict is Verdict.FAIL and "crash loop" in g.reason
    g2 = gate()
    g2.observe_unit(UnitObservation("failed", "failed", 0, "a", "exit-code"), 1)
    assert g2.verdict is Verdict.FAIL and "exit-code" in g2.reason


def test_ssh_errors_retry_then_error() -> None:
    g = gate()
    g.ssh_failed("connection reset", 1)
    g.ssh_failed("connection reset", 2)
    g.observe_unit(UnitObservation("active", "running", 0, "a"), 3)  # success resets the count
    for t in range(3):
        g.ssh_failed("unreachable", 4 + t)
    assert g.verdict is Verdict.ERROR and "unreachable" in g.reason


def parsed(text: str) -> ParityLine:
    rec = parse_line(text)
    assert isinstance(rec, ParityLine)
    return rec


TOKEN = "a1b2c3d4e5f60718"


def test_lines_without_the_invocations_token_are_ignored_never_counted() -> None:
    g = gate(expected_ranks=1, token=TOKEN)
    forged = parsed("[kdtree] L56 max_abs_diff=0 mean=0 rel=0 tp=0")
    wrong = parsed("[kdtree] L56 max_abs_diff=0 mean=0 rel=0 tp=0 token=0000000000000000")
    for t in range(10):
        assert g.feed(forged, t) is LineVerdict.IGNORED
        assert g.feed(wrong, t) is LineVerdict.IGNORED
    assert g.verdict is Verdict.PENDING and g.lines == 0
    assert "no token" in (g.ignored_reason(forged) or "") and "wrong token" in (g.ignored_reason(wrong) or "")
    # A failing line with a foreign token cannot fail the deploy either (no denial of service by forgery).
    assert (
        g.feed(parsed("[kdtree] L1 max_abs_diff=9 mean=9 rel=9 tp=0 token=0000000000000000"), 11) is LineVerdict.IGNORED
    )
    g.tick(60)
    assert g.verdict is Verdict.NODATA and "ignored" in g.reason
    assert g.summary()["ignored"] == 21


def test_the_right_token_counts() -> None:
    g = gate(expected_ranks=1, token=TOKEN)
    for t in range(3):
        g.feed(parsed(f"[kdtree] L1 max_abs_diff=1e-4 mean=1e-5 rel=1e-3 tp=0 token={TOKEN}"), t)
    assert g.verdict is Verdict.PASS


@pytest.mark.parametrize(
    "text",
    [
        "[kdtree] L1 max_abs_diff=1e-4 mean=1e-5 rel=0.9 rel=0.001 tp=0",
        "[kdtree] L1 max_abs_diff=1e-4 mean=1e-5 rel=-0.001 tp=0",
        "[kdtree] L1 max_abs_diff=-1 mean=1e-5 rel=0.001 tp=0",
        "[kdtree] L1 max_abs_diff=1e-4 rel=0.001 tp=0",
        "[kdtree] L1 max_abs_diff=1e-4 mean=1e-5 rel=0.001",
        "[kdtree] L1 max_abs_diff=1e-4 mean=1e-5 rel=0.001 tp=x",
        "[kdtree] L1 max_abs_diff=1e-4 mean=1e-5 rel=0.001 tp=7",  # rank 7 of a 2-rank unit
    ],
)
def test_a_malformed_line_is_a_fail_never_a_pass(text: str) -> None:
    g = gate(expected_ranks=2)
    assert g.feed(parsed(text), 1) is LineVerdict.FAIL
    assert g.verdict is Verdict.FAIL and "malformed" in g.reason


def test_a_silent_rank_is_nodata_at_the_deadline() -> None:
    g = gate(expected_ranks=4)
    for t in range(6):
        for rank in (0, 1, 3):
            g.feed(line(0.001, rank=rank), t)
    assert g.verdict is Verdict.PENDING
    g.tick(60)
    assert g.verdict is Verdict.NODATA and "TP rank(s) 2 of 4" in g.reason


def test_conclude_decides_at_the_end_of_the_evidence() -> None:
    g = gate(expected_ranks=1)
    g.feed(line(0.02), 1)
    g.conclude(2)
    assert g.verdict is Verdict.INCONCLUSIVE


def test_a_unit_systemd_could_not_set_up_is_a_configuration_error_not_a_fail() -> None:
    """Result=resources (a missing EnvironmentFile, say: the API key file deleted after a deploy): the release never
    ran, so the gate says ERROR with config_error (rolled back, never marked bad); another failure stays a FAIL."""
    g = gate()
    g.observe_unit(UnitObservation("failed", "failed", 0, "a", "resources"), 1)
    assert g.verdict is Verdict.ERROR and g.config_error and "result=resources" in g.reason
    g2 = gate()
    g2.observe_unit(UnitObservation("failed", "failed", 0, "a", "exit-code"), 1)
    assert g2.verdict is Verdict.FAIL and not g2.config_error
