"""A probe request the gate's own deadline cut short (or left unsent) says nothing about the release (issue 36
item 8 follow-up): it is not started with less than a sensible minimum left, one cut short is of kind ``cut``, and
the gate counts it unsent, never failed. The last wave of a gate that ran out of time left NODATA, not a FAIL."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opsctl.gate.decision import GateState, Traffic, Verdict
from opsctl.inventory import GateSettings
from opsctl.probe import budget, traffic_on_host
from opsctl.probe.answers import ProbeTally, RequestOutcome, Wave, describe_tally
from opsctl.probe.traffic import worth_a_wave
from tests import builders
from tests.probe.test_traffic import Server, cfg

S = GateSettings(pass_rel=0.01, fail_rel=0.05, consecutive_passes=3, deadline_s=6, max_restarts=1, ssh_retries=2)


@pytest.fixture
def srv() -> Iterator[Server]:
    s = Server()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


# ------------------------------------------------------------------------------------------------ the pure rules


def test_a_request_is_not_started_with_less_than_the_minimum_left() -> None:
    assert budget.request_time_s(30.0, 0.0) is None
    assert budget.request_time_s(30.0, 0.1) is None  # the testbed's "no complete answer within 0s"
    assert budget.request_time_s(30.0, budget.MIN_REQUEST_S - 0.01) is None
    assert budget.request_time_s(30.0, budget.MIN_REQUEST_S) == budget.MIN_REQUEST_S
    assert budget.request_time_s(30.0, 4.5) == 4.5
    assert budget.request_time_s(30.0, 100.0) == 30.0
    assert budget.request_time_s(30.0, None) == 30.0
    # A timeout_s below the minimum: the request starts whenever its whole timeout_s fits.
    assert budget.request_time_s(0.5, 0.5) == 0.5 and budget.request_time_s(0.5, 0.4) is None


@settings(max_examples=300, deadline=None)
@given(
    timeout_s=st.floats(min_value=0.01, max_value=3600, allow_nan=False),
    left_s=st.floats(min_value=-10, max_value=7200, allow_nan=False),
)
def test_a_started_request_never_runs_past_the_deadline_nor_starts_too_short(timeout_s: float, left_s: float) -> None:
    allowed = budget.request_time_s(timeout_s, left_s)
    if allowed is None:
        assert left_s < min(timeout_s, budget.MIN_REQUEST_S)
    else:
        assert allowed <= left_s and allowed <= timeout_s  # item 8: never past the deadline
        assert allowed >= min(timeout_s, budget.MIN_REQUEST_S)


def test_only_a_timeout_set_by_the_deadline_is_cut() -> None:
    assert budget.cut_by_deadline("timeout", 2.0, 30.0)
    assert not budget.cut_by_deadline("timeout", 30.0, 30.0)  # its own timeout_s ran out: the release was slow
    for kind in ("http", "connection", "malformed", "error", "ok"):
        assert not budget.cut_by_deadline(kind, 2.0, 30.0)  # an answer that came (or broke) before the deadline


def test_a_cut_request_is_counted_unsent_never_failed() -> None:
    wave = Wave(
        (
            RequestOutcome("p-0", True, "ok", 200, ttft_s=0.02, tokens=8),
            RequestOutcome("p-1", False, "cut", 200, error="cut short by the gate's deadline after 1.2s"),
        ),
        unsent=2,
    )
    assert wave.failed == () and wave.cause is None and wave.cut == 1 and wave.not_asked == 3
    tally = ProbeTally()
    tally.add(wave)
    assert (tally.sent, tally.answered, tally.failed, tally.unsent) == (1, 1, 0, 3)
    assert "3 not sent or cut short" in describe_tally(tally.summary())


def test_a_real_timeout_beside_a_cut_one_still_fails() -> None:
    wave = Wave(
        (
            RequestOutcome("p-0", False, "timeout", error="no complete answer within 30s"),
            RequestOutcome("p-1", False, "cut", error="cut short by the gate's deadline after 1.2s"),
        )
    )
    assert [r.rid for r in wave.failed] == ["p-0"]


def gate() -> GateState:
    return GateState(
        settings=S,
        started_at=100.0,
        deadline_s=6,
        expected_ranks=1,
        token="t",
        traffic=Traffic.PROBE,
        parity_grace_s=30,
    )


def test_the_last_wave_cut_by_the_deadline_leaves_nodata_not_fail() -> None:
    """The testbed's silent release: answers, no parity line; the wave at the deadline was cut short."""
    g = gate()
    g.server_ready(101.0)
    g.probe_wave(Wave((RequestOutcome("p-0", True, "ok", 200, ttft_s=0.3, tokens=8),)), 102.0)
    g.probe_wave(
        Wave((RequestOutcome("p-1", False, "cut", error="cut short by the gate's deadline"),), unsent=3), 106.0
    )
    assert not g.decided
    g.tick(106.1)
    assert g.verdict is Verdict.NODATA, g.reason
    assert g.summary()["probe"]["failed"] == 0  # type: ignore[index]


def test_the_gate_sends_no_wave_with_less_than_the_minimum_left() -> None:
    h = builders.host(
        "h1", gpu_arch=None, service={"mode": "sglang", "port": 1, "tp": 1}, gate={"probe": {"timeout_s": 30}}
    )
    assert not worth_a_wave(h, 0.05) and not worth_a_wave(h, -1.0)
    assert worth_a_wave(h, budget.MIN_REQUEST_S) and worth_a_wave(h, 5.0)


# ------------------------------------------------------------------------------------------------ the host program


def test_a_request_the_deadline_cuts_is_cut_and_the_rest_unsent(srv: Server) -> None:
    srv.mode = "slow"  # 1.5 s per answer
    t = time.monotonic()
    out = traffic_on_host.run(cfg(srv, requests=4, concurrency=1, timeout_s=3600, finish_within_s=1.3))
    assert time.monotonic() - t < 2.5  # never past the deadline (plus the program's own start)
    assert [r["kind"] for r in out["requests"]] == ["cut"] and out["unsent"] == 3
    assert out["requests"][0]["ok"] is False


def test_no_request_is_started_with_too_little_left(srv: Server) -> None:
    t = time.monotonic()
    out = traffic_on_host.run(
        cfg(srv, requests=4, concurrency=2, timeout_s=3600, finish_within_s=budget.MIN_REQUEST_S / 2)
    )
    assert out["requests"] == [] and out["unsent"] == 4
    assert time.monotonic() - t < budget.MIN_REQUEST_S


def test_a_request_that_outlives_its_own_timeout_still_times_out(srv: Server) -> None:
    srv.mode = "slow"
    out = traffic_on_host.run(cfg(srv, requests=1, concurrency=1, timeout_s=0.5, finish_within_s=60))
    assert [r["kind"] for r in out["requests"]] == ["timeout"]
