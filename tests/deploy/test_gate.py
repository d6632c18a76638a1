import math

from opsctl.gate import GateState, LineVerdict, UnitObservation, Verdict, classify
from opsctl.inventory import GateSettings
from opsctl.parity import ParityLine

S = GateSettings(pass_rel=0.01, fail_rel=0.05, consecutive_passes=3, deadline_s=60, max_restarts=1, ssh_retries=2)


def line(rel: float, rank: int | None = None, layer: int = 1) -> ParityLine:
    return ParityLine(layer=layer, max_abs_diff=rel, mean=rel / 10, rel=rel, rank=rank)


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
