"""The gate's rules for its own verify traffic (opsctl/gate.py with ``traffic``): readiness, probe waves, the grace
for parity lines after the first answer, UNPROVEN, and what UNPROVEN means for the deploy's verdict, its exit code
and a fleet's failure budget. Pure: no host, no clock."""

from __future__ import annotations

import json

from opsctl.errors import EXIT_UNPROVEN, GateFailed
from opsctl.fleet.rollout import HostOutcome, Outcome, outcome_from_result, plan_rollout, run_rollout
from opsctl.gate.decision import NO_TRAFFIC_REASON, GateState, Traffic, Verdict
from opsctl.gate.lines import ParityLine
from opsctl.host.history import HistoryEvent, parse_history
from opsctl.hostdata.facts import UnitObservation
from opsctl.inventory import GateSettings, HostConfig
from opsctl.pipeline.result import DeployResult, DeployVerdict, describe_restart_times, last_restart_times
from opsctl.probe.answers import RequestOutcome, Wave
from tests import builders

S = GateSettings(pass_rel=0.01, fail_rel=0.05, consecutive_passes=3, deadline_s=60, max_restarts=1, ssh_retries=2)
TOKEN = "t0k3n"


def line(rel: float, rank: int, layer: int = 0) -> ParityLine:
    return ParityLine(layer=layer, max_abs_diff=rel, mean=rel / 10, rel=rel, rank=rank, token=TOKEN)


def gate(traffic: Traffic = Traffic.PROBE, ranks: int = 2, grace: float = 10.0) -> GateState:
    return GateState(
        settings=S,
        started_at=100.0,
        deadline_s=S.deadline_s,
        expected_ranks=ranks,
        token=TOKEN,
        traffic=traffic,
        parity_grace_s=grace,
    )


def answered(n: int = 4, ttft: float = 0.02, first: int = 0) -> Wave:
    return Wave(
        tuple(
            RequestOutcome(f"opsctl-probe-abc-{i}", True, "ok", 200, ttft_s=ttft + i / 1000, tokens=8)
            for i in range(first, first + n)
        ),
        elapsed_s=0.3,
    )


def failing(status: int | None, kind: str, error: str, n: int = 4) -> Wave:
    return Wave(tuple(RequestOutcome(f"opsctl-probe-abc-{i}", False, kind, status, error) for i in range(n)))


def test_answered_waves_and_passing_lines_on_every_rank_pass_with_the_probe_figures() -> None:
    g = gate()
    g.server_ready(103.0)
    g.probe_wave(answered(), 103.5)
    for _ in range(3):
        for rank in (0, 1):
            g.feed(line(0.001, rank), 103.6)
    assert g.verdict is Verdict.PASS
    probe = g.summary()["probe"]
    assert probe == {
        "sent": 4,
        "answered": 4,
        "failed": 0,
        "failures": [],
        "unsent": 0,
        "waves": 1,
        "ttft_ms": {"min": 20.0, "median": 21.5, "max": 23.0},
        "api_key": False,
        "ready_after_s": 3.0,
        "verdict_after_ready_s": 0.6,
    }


def test_a_server_error_on_a_probe_request_fails_at_once_naming_the_answer() -> None:
    g = gate()
    g.server_ready(101.0)
    g.probe_wave(failing(500, "http", "HTTP 500: internal error"), 102.0)
    assert g.verdict is Verdict.FAIL
    assert g.reason == "probe requests failed: 4 of 4 (HTTP 500: internal error)"
    assert g.summary()["probe"]["failures"] == ["HTTP 500: internal error"]  # type: ignore[index]


def test_one_timeout_among_answers_fails_and_timeouts_malformed_and_resets_all_count() -> None:
    mixed = Wave(
        (
            *answered(2).requests,
            RequestOutcome("r-2", False, "timeout", None, "no complete answer within 60s"),
            RequestOutcome("r-3", False, "malformed", 200, "malformed answer: no meta_info in a chunk"),
        )
    )
    g = gate()
    g.server_ready(101.0)
    g.probe_wave(mixed, 102.0)
    assert g.verdict is Verdict.FAIL
    assert "2 of 4" in g.reason and "within 60s" in g.reason and "no meta_info" in g.reason
    assert (g.probe.sent, g.probe.answered, g.probe.failed) == (4, 2, 2)


def test_refused_requests_are_an_error_of_the_probe_not_a_verdict_on_the_release() -> None:
    g = gate()
    g.probe_wave(failing(401, "http", "HTTP 401: missing API key"), 102.0)
    assert g.verdict is Verdict.ERROR and "API key in service.environment_file" in g.reason
    # 429 (server full) and 408 are the server's trouble: a FAIL.
    g2 = gate()
    g2.probe_wave(failing(429, "http", "HTTP 429: too many requests"), 102.0)
    assert g2.verdict is Verdict.FAIL


def test_a_rank_silent_past_the_grace_after_the_first_answer_fails_naming_it() -> None:
    g = gate(grace=10.0)
    g.server_ready(101.0)
    g.probe_wave(answered(), 102.0)
    g.feed(line(0.001, 0), 102.1)
    g.tick(111.9)
    assert g.verdict is Verdict.PENDING  # still inside the grace
    g.tick(112.0)
    assert g.verdict is Verdict.FAIL
    assert g.reason == (
        "probes answered (4 of 4 requests) but TP rank(s) 1 of 2 printed no parity line within 10s of the first answer"
    )


def test_answers_without_any_counted_line_fail_and_say_lines_were_ignored() -> None:
    g = gate(grace=5.0)
    g.server_ready(101.0)
    g.probe_wave(answered(), 102.0)
    g.feed(ParityLine(0, 0.001, 0.0001, 0.001, rank=0, token="someone-else"), 102.5)
    g.tick(107.0)
    assert g.verdict is Verdict.FAIL and "TP rank(s) 0, 1 of 2" in g.reason and "1 lines ignored" in g.reason


def test_the_grace_counts_from_the_first_answer_not_from_readiness() -> None:
    g = gate(grace=10.0)
    g.server_ready(101.0)
    g.tick(130.0)  # ready but no wave answered yet (a slow first wave)
    assert g.verdict is Verdict.PENDING


def test_a_server_never_ready_by_the_deadline_fails_with_its_last_answer() -> None:
    g = gate()
    g.server_not_ready("GET /health: HTTP 503")
    g.tick(159.9)
    assert g.verdict is Verdict.PENDING
    g.tick(160.0)
    assert g.verdict is Verdict.FAIL
    assert g.reason == "the server was not ready within 60s (GET /health: HTTP 503)"
    assert g.summary()["probe"]["ready_after_s"] is None  # type: ignore[index]


def test_the_unit_failing_is_the_reason_when_it_comes_before_the_wave() -> None:
    g = gate()
    g.server_ready(101.0)
    g.observe_unit(UnitObservation("failed", "failed", 0, "inv", "exit-code"), 102.0)
    g.probe_wave(failing(None, "connection", "ConnectionRefusedError: refused"), 102.0)
    assert g.verdict is Verdict.FAIL and g.reason.startswith("unit failed")


def test_no_traffic_and_no_line_by_the_deadline_is_unproven() -> None:
    g = gate(Traffic.NONE)
    g.tick(160.0)
    assert g.verdict is Verdict.UNPROVEN and not g.verdict.ok
    assert g.reason == f"{NO_TRAFFIC_REASON} (no parity line within 60s)"
    assert "probe" not in g.summary()


def test_without_the_probe_lines_of_another_token_or_a_silent_rank_stay_nodata() -> None:
    g = gate(Traffic.NONE)
    g.feed(ParityLine(0, 0.001, 0.0001, 0.001, rank=0, token="forged"), 110.0)
    g.tick(160.0)
    assert g.verdict is Verdict.NODATA  # something printed: not "no traffic"
    g2 = gate(Traffic.NONE)
    g2.feed(line(0.001, 0), 110.0)
    g2.tick(160.0)
    assert g2.verdict is Verdict.NODATA and "TP rank(s) 1 of 2" in g2.reason


def test_the_replay_service_with_no_line_is_still_nodata() -> None:
    g = gate(Traffic.SELF)
    g.tick(160.0)
    assert g.verdict is Verdict.NODATA


def test_unproven_exit_code_and_bad_mark() -> None:
    v = DeployVerdict(str(Verdict.UNPROVEN))
    assert v is DeployVerdict.UNPROVEN and not v.ok and not v.marks_bad
    assert v.exit_code == EXIT_UNPROVEN == 32
    assert DeployVerdict.FAIL.marks_bad and DeployVerdict.NODATA.marks_bad and DeployVerdict.ERROR.marks_bad
    assert not DeployVerdict.INTERRUPTED.marks_bad and DeployVerdict.FAIL.exit_code == GateFailed.exit_code


def test_the_verdict_line_carries_the_probe() -> None:
    g = gate()
    g.server_ready(103.0)
    g.probe_wave(answered(), 103.5)
    for _ in range(3):
        for rank in (0, 1):
            g.feed(line(0.001, rank), 104.0)
    res = DeployResult("h1", "deploy", "r1", DeployVerdict.PASS, g.reason, gate=g.summary(), elapsed_s=9.0)
    assert res.line().endswith(
        "; probe: 4/4 answered, TTFT median 21.5 ms, ready 3.0s after the restart, verdict 1.0s later [9.0s]"
    )


HOSTS = [builders.host(f"h{i}", gpu_arch=None) for i in range(4)]


def test_an_unproven_host_does_not_count_against_max_fail_but_the_roll_out_is_not_ok() -> None:
    unproven = DeployResult("h1", "deploy", "r1", DeployVerdict.UNPROVEN, NO_TRAFFIC_REASON, rolled_back_to="r0")
    assert outcome_from_result(unproven).outcome is Outcome.UNPROVEN
    plan = plan_rollout(HOSTS, canary="h0", batch=1, max_fail="0%")

    def act(h: HostConfig) -> HostOutcome:
        return outcome_from_result(DeployResult(h.name, "deploy", "r1", DeployVerdict.PASS))

    def act_h2_unproven(h: HostConfig) -> HostOutcome:
        if h.name == "h2":
            return outcome_from_result(DeployResult(h.name, "deploy", "r1", DeployVerdict.UNPROVEN, NO_TRAFFIC_REASON))
        return act(h)

    report = run_rollout(plan, act_h2_unproven)
    assert report.stopped is None and [o.outcome for o in report.outcomes].count(Outcome.OK) == 3
    assert not report.ok and not report.failures


def test_an_unproven_canary_stops_the_roll_out() -> None:
    plan = plan_rollout(HOSTS, canary="h0", batch=2, max_fail="50%")
    report = run_rollout(
        plan, lambda h: outcome_from_result(DeployResult(h.name, "deploy", "r1", DeployVerdict.UNPROVEN, "idle"))
    )
    assert report.stopped == "canary h0 UNPROVEN: idle"
    assert [o.outcome for o in report.outcomes] == [Outcome.UNPROVEN, *[Outcome.SKIPPED] * 3]


def test_status_reads_the_newest_probed_restart_from_the_history() -> None:
    lines = [
        {"event": "deploy", "release": "r1", "verdict": "PASS", "at": "t1", "gate": {"elapsed_s": 9.0}},
        {
            "event": "deploy",
            "release": "r2",
            "verdict": "FAIL",
            "at": "t2",
            "gate": {"elapsed_s": 4.2, "probe": {"ready_after_s": 3.1, "verdict_after_ready_s": 1.1}},
        },
        {
            "event": "rollback",
            "release": "r1",
            "verdict": "PASS",
            "at": "t3",
            "gate": {"elapsed_s": 4.0, "probe": {"ready_after_s": 3.2, "verdict_after_ready_s": 0.8}},
        },
        {"event": "deploy-start", "release": "r3", "at": "t4"},
    ]
    history = parse_history("\n".join(json.dumps(doc) for doc in lines))
    times = last_restart_times(history)
    assert times is not None and (times.event, times.release, times.ready_after_s) == (HistoryEvent.ROLLBACK, "r1", 3.2)
    assert times.verdict is DeployVerdict.PASS
    assert describe_restart_times(times) == (
        "ready 3.2s after the restart, verdict PASS 0.8s later (4.0s after the restart); rollback r1 at t3"
    )
    assert last_restart_times(history[:1]) is None
